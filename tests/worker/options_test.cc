// dsv4-worker's backend flags (--backend, --attention-kernel, --weight-load, --fuse-projections, --gpu-memory-fraction,
// --mem-fraction, --cuda-graphs) and the CUDA-graph bucket ladder: what ValidateOptions (and so --validate-only) accepts and refuses, by name.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/options.h"
#if defined(DSV4_WORKER_HAVE_MODEL)
#include "worker/dsv4_executor.h"
#endif

namespace dsv4::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

WorkerOptions Cuda() {
  WorkerOptions o;
  o.checkpoint = "/nonexistent/ckpt";  // not opened by ValidateOptions
  o.backend = "cuda";
  return o;
}

void ExpectRefused(const WorkerOptions& o, const std::string& names) {
  const absl::Status s = ValidateOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(names));
}

TEST(WorkerOptions, CudaBackendIsAccepted) {
  EXPECT_TRUE(ValidateOptions(Cuda()).ok()) << ValidateOptions(Cuda());
  WorkerOptions o = Cuda();
  o.attention_kernel = "simt";
  o.cuda_graphs = false;
  o.gpu_memory_fraction = 1;
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
}

TEST(WorkerOptions, BackendFlagsAreChecked) {
  WorkerOptions o = Cuda();
  o.backend = "tpu";
  ExpectRefused(o, "--backend 'tpu' must be cpu or cuda");
  o = Cuda();
  o.attention_kernel = "fast";
  ExpectRefused(o, "--attention-kernel 'fast' must be mma or simt");
  for (const char* mode : {"auto", "mapped", "streamed"}) {
    o = Cuda();
    o.weight_load = mode;
    EXPECT_TRUE(ValidateOptions(o).ok()) << mode << ": " << ValidateOptions(o);
  }
  o.weight_load = "mmap";
  ExpectRefused(o, "--weight-load 'mmap' must be auto, mapped or streamed");
  o = Cuda();
  o.stall_timeout_s = -1;
  ExpectRefused(o, "--stall-timeout -1 must be >= 0");
  for (double f : {0.0, -0.5, 1.01}) {
    o = Cuda();
    o.gpu_memory_fraction = f;
    ExpectRefused(o, "--gpu-memory-fraction");
  }
  o = Cuda();
  o.mem_fraction_set = true;  // host-memory sizing makes no sense for device pools: say which flag to use
  ExpectRefused(o, "use --gpu-memory-fraction");
  o.backend = "cpu";
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
}

TEST(WorkerOptions, GraphBucketsEndAtMaxBatch) {
  WorkerOptions o = Cuda();
  o.max_batch = 32;
  EXPECT_THAT(GraphBuckets(o), ElementsAre(1, 2, 4, 8, 16, 24, 32));
  o.max_batch = 40;
  EXPECT_THAT(GraphBuckets(o), ElementsAre(1, 2, 4, 8, 16, 24, 32, 40));
  o.max_batch = 1;
  EXPECT_THAT(GraphBuckets(o), ElementsAre(1));
  o.max_batch = 300;
  EXPECT_THAT(GraphBuckets(o), ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 192, 256, 300));
  o.cuda_graphs = false;
  EXPECT_EQ(GraphBuckets(o).size(), 16u) << "graphs off still pads decode steps to the buckets";
  o.backend = "cpu";
  EXPECT_TRUE(GraphBuckets(o).empty()) << "the CPU backend has no graphs";
}

TEST(WorkerOptions, DescribeNamesTheDeploymentChoices) {
  WorkerOptions o = Cuda();
  o.cuda_graphs = false;
  const std::string d = DescribeOptions(o);
  EXPECT_THAT(d, HasSubstr("backend cuda"));
  EXPECT_THAT(d, HasSubstr("cuda graphs off"));
  EXPECT_THAT(d, HasSubstr("attention mma"));
  EXPECT_THAT(d, ::testing::Not(HasSubstr("unfused")));
  o.fuse_projections = false;
  EXPECT_THAT(DescribeOptions(o), HasSubstr("projections unfused"));
}

#if defined(DSV4_WORKER_HAVE_MODEL)
// --fuse-projections reaches the model's options through the executor options every rank builds.
TEST(WorkerOptions, FuseProjectionsReachesTheExecutor) {
  WorkerOptions o = Cuda();
  EXPECT_TRUE(ExecutorOptions(o).fuse_projections);
  o.fuse_projections = false;
  EXPECT_FALSE(ExecutorOptions(o).fuse_projections);
}
#endif

}  // namespace
}  // namespace dsv4::worker
