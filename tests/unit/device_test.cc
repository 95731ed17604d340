// Where a job trains (spec.device) and the device side of Tensor, as seen on any machine: on one
// without a usable CUDA device, a job that wants CUDA is a configuration error naming spec.device
// and saying how to train on the CPU, never a silent fall-back.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "worker/core/device.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

JobConfig job(const std::string& device, int gpus) {
  JobConfig c;
  c.device = device;
  c.gpus_per_pod = gpus;
  return c;
}

bool have_gpu() { return gpu::device_count() > 0; }

std::string config_error(const JobConfig& c) {
  try {
    resolve_device(c);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems().front().field, "spec.device");
    return e.problems().front().reason;
  }
  return "";
}

TEST(DeviceTest, CpuAndJobsWithoutGpusTrainOnTheCpu) {
  unsetenv("TESSERA_GPU");
  EXPECT_EQ(resolve_device(job("cpu", 0)), Device::kCpu);
  EXPECT_EQ(resolve_device(job("cpu", 8)), Device::kCpu) << "device: cpu is honoured whatever the pod was given";
  EXPECT_EQ(resolve_device(job("auto", 0)), Device::kCpu);
}

TEST(DeviceTest, WantingCudaWithoutADeviceIsAConfigurationError) {
  if (have_gpu()) GTEST_SKIP() << "this machine has a CUDA device";
  unsetenv("TESSERA_GPU");
  const std::string asked = config_error(job("auto", 2));
  EXPECT_NE(asked.find("2 GPU(s) per pod (spec.resources.gpu)"), std::string::npos) << asked;
  EXPECT_NE(asked.find("set spec.device: cpu"), std::string::npos) << asked;
  const std::string forced = config_error(job("cuda", 0));
  EXPECT_NE(forced.find("no usable CUDA device"), std::string::npos) << forced;
  // A slot of `tessera-worker --slots` that was handed a GPU ID wants CUDA under auto too.
  setenv("TESSERA_GPU", "3", 1);
  EXPECT_NE(config_error(job("auto", 0)), "");
  unsetenv("TESSERA_GPU");
}

TEST(DeviceTest, HostTensorsStayWhereTheyAre) {
  Tensor t = Tensor::filled({3, 2}, 1.5f);
  EXPECT_EQ(t.device(), Device::kCpu);
  const Tensor same = t.to(Device::kCpu);
  EXPECT_EQ(same.data(), t.data()) << "to() the device a tensor is on shares its storage";
  Tensor copy({6});
  copy.copy_from(t);
  EXPECT_EQ(copy[5], 1.5f);
  EXPECT_STREQ(device_name(Device::kCuda), "cuda");
  if (!have_gpu()) {
    std::string why;
    EXPECT_EQ(gpu::device_count(&why), 0);
    EXPECT_FALSE(why.empty()) << "the reason there is no device is given";
    EXPECT_THROW(Tensor({4}, Layout::kPlain, Device::kCuda), Error);
  }
}

TEST(DeviceTest, SlotsTakeTheirIndexAmongThePodsGpus) {
  unsetenv("TESSERA_GPU_INDEX");
  EXPECT_EQ(rank_gpu_ordinal(), 0);
  setenv("TESSERA_GPU_INDEX", "3", 1);
  EXPECT_EQ(rank_gpu_ordinal(), 3);
  unsetenv("TESSERA_GPU_INDEX");
}

}  // namespace
}  // namespace tessera
