"""One `tessera run` of a job in its own work directory, for the end-to-end tests of the local
backend: its status (status.json), waits bounded by TIMEOUT, its output, and `tessera node`."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

TIMEOUT = 300  # seconds for one run


@contextlib.contextmanager
def scratch_runs(prefix):
    """A scratch directory for a test's runs and the list to add each LocalRun to: on the way out,
    passed or failed, every run is stopped and the directory removed."""
    root = tempfile.mkdtemp(prefix=prefix)
    runs = []
    try:
        yield root, runs
    finally:
        for r in runs:
            r.stop()
        shutil.rmtree(root, ignore_errors=True)


class LocalRun:
    def __init__(self, bin_dir, work, manifest):
        self.bin = bin_dir
        self.work = work
        os.makedirs(self.work)
        self.job = os.path.join(self.work, "job.yaml")
        with open(self.job, "w") as f:
            f.write(manifest)
        self.log = open(os.path.join(self.work, "run.log"), "w")
        self.proc = subprocess.Popen([os.path.join(bin_dir, "tessera"), "run", self.job, "--work-dir", self.work,
                                      "--progress", "5"], stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.started = time.monotonic()

    def status(self):
        try:
            with open(os.path.join(self.work, "status.json")) as f:
                return json.load(f).get("status", {})
        except (OSError, ValueError):
            return {}

    def wait(self, what, ok):
        """The status once ok(status) holds; AssertionError when the job ends first or TIMEOUT passes."""
        while time.monotonic() - self.started < TIMEOUT:
            s = self.status()
            if ok(s):
                return s
            if self.proc.poll() is not None:
                raise AssertionError("the job ended before %s: %s" % (what, self.output()))
            time.sleep(0.02)
        raise AssertionError("%s not seen in %d s: %s" % (what, TIMEOUT, self.output()))

    def wait_for_step(self, step):
        return self.wait("step %d" % step, lambda s: s.get("step", -1) >= step and s.get("workers"))

    def node(self, verb, name):
        """tessera node remove|add NAME for this run."""
        r = subprocess.run([os.path.join(self.bin, "tessera"), "node", verb, name, "--work-dir", self.work],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError("tessera node %s %s: %s" % (verb, name, r.stderr))

    def finish(self):
        """The final status of a run that must succeed."""
        try:
            rc = self.proc.wait(timeout=max(1, TIMEOUT - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError("the job did not finish in %d s: %s" % (TIMEOUT, self.output()))
        if rc != 0:
            raise AssertionError("tessera run exited %d: %s" % (rc, self.output()))
        s = self.status()
        if s.get("phase") != "Succeeded":
            raise AssertionError("phase %s: %s" % (s.get("phase"), self.output()))
        return s

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(os.path.join(self.work, "run.log")) as f:
            return f.read()[-3000:]
