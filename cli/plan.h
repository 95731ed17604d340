// tessera plan JOB.yaml --links RATE ...: the predicted step of each gradient exchange for a job.
#pragma once

namespace tessera {

int plan(int argc, char** argv);

}  // namespace tessera
