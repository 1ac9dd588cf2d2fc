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

// A call of a graph names the graph in its args, at the server and in the
// client's ring alike; the client's ring is a process of its own, its
// clock aligned by its offset; a value read in place is a transfer on the
// reading device's track, with a flow to the task of the call that read it.
TEST(ChromeTraceTest, GraphsClientRingsAndTransfersWithinAWorker) {
  proto::TraceReply trace;
  proto::TimelineRing* server = trace.add_rings();
  proto::TimelineEvent call = Event(EventKind::kCall, 1000, 90000, 5);
  call.set_graph_id(3);
  *server->add_events() = call;

  proto::TimelineRing* w1 = trace.add_rings();
  w1->set_worker_id(1);
  w1->set_host_name("host0");
  proto::TimelineEvent alias = Event(EventKind::kTransfer, 2000, 2000, 5);
  alias.set_peer(1);
  alias.set_device(0);
  alias.set_path(static_cast<int>(TransferPath::kAlias));
  *w1->add_events() = alias;
  proto::TimelineEvent task = Event(EventKind::kTask, 2000, 9000, 5);
  task.set_device(0);
  *w1->add_events() = task;

  proto::TimelineRing* client = trace.add_rings();
  client->set_client_id(1);
  client->set_process("client trainer (1)");
  client->set_offset_ns(500);
  proto::TimelineEvent issued = Event(EventKind::kCall, 0, 400, 5);
  issued.set_graph_id(3);
  *client->add_events() = issued;
  *client->add_events() = Event(EventKind::kFetch, 95000, 99000, 0);

  const std::string json = ChromeTraceJson(trace);
  EXPECT_THAT(json, HasSubstr("\"cat\":\"call\",\"id\":1,\"args\":{"
                              "\"client\":1,\"call\":5,\"program\":9,"
                              "\"graph\":3"));
  EXPECT_THAT(json, HasSubstr("\"cat\":\"call issued\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"client trainer (1)\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"device 0 reads\""));
  EXPECT_THAT(json, HasSubstr("\"transfer (alias)\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"fetch\",\"cat\":\"client\""));
  EXPECT_THAT(json, HasSubstr("\"flows\":1"));
  // The client's call, issued at 0 on its clock, 500 ns on the server's:
  // the trace's origin.
  EXPECT_THAT(json, HasSubstr("\"origin_ns\":500"));
  EXPECT_THAT(json, HasSubstr("\"client_id\":1"));
}

}  // namespace
}  // namespace plexus
