#include "plexus/timeline/chrome_trace.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/timeline/timeline.h"
#include "plexus/timeline/timeline_proto.h"

namespace plexus {
namespace {

using ::testing::HasSubstr;

proto::TimelineEvent Event(EventKind kind, int64_t start, int64_t end,
                           uint64_t call) {
  TimelineEvent e;
  e.kind = kind;
  e.start_ns = start;
  e.end_ns = end;
  e.client_id = 1;
  e.call_id = call;
  e.program_id = 9;
  proto::TimelineEvent out;
  ToProto(e, &out);
  return out;
}

TEST(ChromeTraceTest, NamesCallsAndDrawsAFlowFromTransferToConsumer) {
  proto::TraceReply trace;
  trace.add_programs()->set_name("mlp_step");
  trace.mutable_programs(0)->set_client_id(1);
  trace.mutable_programs(0)->set_program_id(9);
  proto::ClientCallSite* site = trace.add_sites();
  site->set_client_id(1);
  site->set_site(3);
  site->set_text("train.py:42 in step");

  proto::TimelineRing* server = trace.add_rings();
  proto::TimelineEvent call = Event(EventKind::kCall, 1000, 90000, 5);
  call.set_label(3);
  *server->add_events() = call;

  proto::TimelineRing* w1 = trace.add_rings();
  w1->set_worker_id(1);
  w1->set_host_name("host0");
  w1->set_offset_ns(-1000);
  proto::TimelineEvent transfer = Event(EventKind::kTransfer, 3000, 8000, 5);
  transfer.set_peer(2);
  transfer.set_device(0);
  transfer.set_path(static_cast<int>(TransferPath::kTcp));
  *w1->add_events() = transfer;

  proto::TimelineRing* w2 = trace.add_rings();
  w2->set_worker_id(2);
  w2->set_host_name("host1");
  proto::TimelineEvent task = Event(EventKind::kTask, 9000, 20000, 5);
  task.set_device(0);
  *w2->add_events() = task;

  const std::string json = ChromeTraceJson(trace);
  EXPECT_THAT(json, HasSubstr("\"mlp_step @ train.py:42 in step\""));
  EXPECT_THAT(json, HasSubstr("\"transfer (tcp)\""));
  EXPECT_THAT(json, HasSubstr("\"host1 (worker 2)\""));
  EXPECT_THAT(json, HasSubstr("\"ph\":\"s\""));
  EXPECT_THAT(json,
              HasSubstr("\"ph\":\"f\",\"bp\":\"e\",\"pid\":3,\"tid\":100"));
  EXPECT_THAT(json, HasSubstr("\"flows\":1"));
  // The worker's offset applies: its transfer starts 1 us after the
  // trace's origin (the call, at 1000 ns), 2 us on its own clock.
  EXPECT_THAT(json, HasSubstr("\"ts\":1.000,\"dur\":5.000"));
}

}  // namespace
}  // namespace plexus
