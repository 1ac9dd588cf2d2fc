// The report queue on a FakeClock: finished calls wait for their batch's
// delay (or a full batch) without anyone sleeping; failed transfers and
// Close() end a wait at once.
#include "plexus/worker/report_queue.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/common/clock.h"

namespace plexus {
namespace {

proto::Execute Call(uint64_t client, uint64_t ticket) {
  proto::Execute exec;
  exec.set_client_id(client);
  exec.set_ticket(ticket);
  exec.add_tasks();
  return exec;
}

TEST(ReportQueueTest, AFinishedCallGoesOutOnceItsBatchDelayHasPassed) {
  FakeClock clock;
  ReportQueue reports(&clock);
  reports.CallFinished(Call(7, 1), /*failed=*/false, 10, 2);
  std::vector<proto::WorkerToServer> out;
  absl::Notification taken;
  std::thread writer([&] {
    EXPECT_TRUE(reports.AwaitReports(&out));
    taken.Notify();
  });
  clock.AwaitWaiters(1);  // the writer waits for the delay, on the clock
  EXPECT_FALSE(taken.HasBeenNotified());
  clock.Advance(ReportQueue::kReportDelay);
  writer.join();
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_calls_done());
  EXPECT_EQ(out[0].calls_done().tickets_size(), 1);
  EXPECT_EQ(out[0].calls_done().tickets(0), 1u);
  EXPECT_EQ(out[0].calls_done().busy_micros(0), 10);
}

TEST(ReportQueueTest, AFullBatchAndAFailedTransferGoAtOnce) {
  FakeClock clock;
  ReportQueue reports(&clock);
  for (int i = 1; i <= ReportQueue::kReportBatch; ++i) {
    reports.CallFinished(Call(7, i), /*failed=*/i == 3, 1, 0);
  }
  std::vector<proto::WorkerToServer> out;
  ASSERT_TRUE(reports.AwaitReports(&out));  // no time has passed
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].calls_done().tickets_size(), ReportQueue::kReportBatch);
  EXPECT_EQ(out[0].calls_done().failed_tickets_size(), 1);

  out.clear();
  reports.TransferFailed(4, {99, 1}, absl::UnavailableError("gone"));
  ASSERT_TRUE(reports.AwaitReports(&out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].transfer_failed().dst_worker_id(), 4);
  EXPECT_EQ(out[0].transfer_failed().buffer_id(), 99u);
}

TEST(ReportQueueTest, CloseEndsTheWriterAndUsageIsKeptPerLiveClient) {
  FakeClock clock;
  ReportQueue reports(&clock);
  reports.CallFinished(Call(7, 0), /*failed=*/false, 5, 1);  // a harness's
  reports.CallFinished(Call(8, 0), /*failed=*/false, 6, 1);
  reports.ClientGone(8);
  std::optional<std::vector<proto::ClientUsage>> usage = reports.TryUsage();
  ASSERT_TRUE(usage.has_value());
  ASSERT_EQ(usage->size(), 1u);
  EXPECT_EQ((*usage)[0].client_id(), 7u);
  EXPECT_EQ((*usage)[0].busy_micros(), 5);

  std::thread writer([&] {
    std::vector<proto::WorkerToServer> out;
    EXPECT_FALSE(reports.AwaitReports(&out));  // nothing to report: waits
  });
  reports.Close();
  writer.join();
}

}  // namespace
}  // namespace plexus
