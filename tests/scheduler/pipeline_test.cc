// Pipeline parallelism: vLLM's layer split, the steady-state cycle of the
// in-flight batches and a batch's stage times (scheduler/pipeline.h), every
// expected value worked out by hand.
#include "scheduler/pipeline.h"

#include <vector>

#include "gtest/gtest.h"

namespace servesim::scheduler {
namespace {

TEST(PipelineTest, LayersSplitAsVllmDoesTheRemainderBeforeTheLastStage) {
  EXPECT_EQ(PipelineLayers(126, 2), (std::vector<int64_t>{63, 63}));
  EXPECT_EQ(PipelineLayers(61, 2), (std::vector<int64_t>{31, 30}));
  EXPECT_EQ(PipelineLayers(7, 3), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(PipelineLayers(43, 10), (std::vector<int64_t>{4, 4, 4, 4, 4, 4, 5, 5, 5, 4}));
  EXPECT_EQ(PipelineLayers(32, 1), (std::vector<int64_t>{32}));
}

TEST(PipelineTest, TwoStagesFourBatchesInFlight) {
  // Equal stages of 1 s, 0.1 s per hand-off: the stages are busy 4 s a
  // cycle, a batch's round trip is 2.1 s: the cycle is 4 s, no bubble.
  std::vector<PipelineStep> steps(4, PipelineStep{{1.0, 1.0}, 0.1});
  PipelineCycle c = SteadyCycle(steps, 2);
  EXPECT_DOUBLE_EQ(c.busiest_stage_s, 4);
  EXPECT_DOUBLE_EQ(c.round_trip_s, 2.1);
  EXPECT_DOUBLE_EQ(c.time_s, 4);
  EXPECT_DOUBLE_EQ(c.bubble, 0);
  // Uneven stages (1 s and 1.5 s): the second bounds the cycle at 6 s while
  // 10 s of work fill 2 x 6: a bubble of 1/6.
  steps.assign(4, PipelineStep{{1.0, 1.5}, 0.1});
  c = SteadyCycle(steps, 2);
  EXPECT_DOUBLE_EQ(c.time_s, 6);
  EXPECT_NEAR(c.bubble, 1.0 / 6, 1e-15);
  // One batch in flight: its round trip, 2.1 s, and the stages idle 1 -
  // 2 / (2 x 2.1) of it.
  c = SteadyCycle(std::vector<PipelineStep>{{{1.0, 1.0}, 0.1}}, 2);
  EXPECT_DOUBLE_EQ(c.time_s, 2.1);
  EXPECT_NEAR(c.bubble, 1 - 2 / 4.2, 1e-15);
  EXPECT_DOUBLE_EQ(SteadyCycle({}, 2).time_s, 0);
}

TEST(PipelineTest, StagesShareTheLayersTimeAndTheEndsTheirOwnOps) {
  PipelineConfig pc;
  pc.layers = {31, 30};
  pc.num_layers = 61;
  pc.tensor_parallel = 8;
  pc.d_model = 7168;
  pc.act_bytes = 2;
  pc.link_bytes_per_s = 50e9;
  pc.link_latency_s = 5e-6;
  IterationCost cost;
  cost.time_s = 0.0612 + 0.001 + 0.002 + 0.003;
  cost.stages[static_cast<int>(devices::Stage::kEmbedding)].time_s = 0.001;
  cost.stages[static_cast<int>(devices::Stage::kFinalNorm)].time_s = 0.002;
  cost.stages[static_cast<int>(devices::Stage::kLmHead)].time_s = 0.003;
  const PipelineStep p = StepOf(pc, cost, 100);
  ASSERT_EQ(p.stage_s.size(), 2u);
  // 61.2 ms of layers: 31/61 and 30/61 of it, plus each end's ops.
  EXPECT_NEAR(p.stage_s[0], 0.0612 * 31 / 61 + 0.001, 1e-15);
  EXPECT_NEAR(p.stage_s[1], 0.0612 * 30 / 61 + 0.005, 1e-15);
  // Hidden states and residual, 2 x 100 x 7168 x 2 bytes, split over 8
  // NICs at 50 GB/s, after 5 us.
  EXPECT_DOUBLE_EQ(StageTransferBytes(pc, 100), 2867200);
  EXPECT_NEAR(p.transfer_s, 5e-6 + 2867200.0 / (8 * 50e9), 1e-18);
}

}  // namespace
}  // namespace servesim::scheduler
