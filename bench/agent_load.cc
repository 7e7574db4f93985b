// servesim-agent-load: a bounded load test of one device agent on loopback
// Starts `servesim-agent --device KIND --listen 127.0.0.1:0`,
// then N client threads (a channel each) call it as fast as they can:
//  - Estimate: an iteration of GPT-3 175B's attention on the device (two
//    head groups sharing a sequence list, as the simulator sends them), for
//    a batch of 1..32 requests that decode step by step (past_tokens + 1 per
//    call, so AttAcc's schedule memo keeps meeting new keys) while finished
//    requests are replaced by new ones (fresh request ids); on a gpu agent
//    one in four calls carries a prefill chunk (the attention devices run
//    decode only); all-decode calls ask 8 lookahead steps.
//  - every 8th iteration of a client, a whole session: OpenSession,
//    AppendKv (16..128 positions), Step, CloseSession (4 calls), so many
//    distinct sessions come and go.
// After a warm-up (gRPC's threads and pools, the first memo entries), the
// agent's VmRSS (/proc/PID/status) is read, the load runs T seconds, and
// VmRSS is read again. Prints calls/s, p50/p99 latency, errors and the
// RSS figures; exits 1 if any call failed or RSS grew by more than the
// bound (--max-rss-growth-mib), 2 for a bad command line.
//
// Usage: servesim-agent-load --agent PATH [--device KIND] [--clients N]
//          [--seconds T] [--warmup S] [--max-rss-growth-mib M]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "servesim/v1/agent.grpc.pb.h"

namespace {

namespace v1 = servesim::v1;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string agent;
  std::string device = "attacc";
  int clients = 8;
  double seconds = 10;
  double warmup_s = 1;
  double max_growth_mib = 64;
};

int Usage(const std::string& why) {
  std::cerr << "servesim-agent-load: " << why
            << "\nusage: servesim-agent-load --agent PATH [--device KIND] [--clients N] "
               "[--seconds T] [--warmup S] [--max-rss-growth-mib M]\n";
  return 2;
}

// "VmRSS:    12345 kB" -> MiB; -1 if the process is gone.
double RssMib(pid_t pid, const char* field = "VmRSS:") {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      std::istringstream s(line.substr(std::strlen(field)));
      double kb = 0;
      s >> kb;
      return kb / 1024;
    }
  }
  return -1;
}

struct Agent {
  pid_t pid = -1;
  std::string address;
};

Agent StartAgent(const Options& o, const std::string& log) {
  Agent a;
  a.pid = fork();
  if (a.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<std::string> args = {o.agent, "--device", o.device, "--listen", "127.0.0.1:0"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  // "servesim-agent: serving KIND on HOST:PORT"
  for (int i = 0; i < 1500 && a.address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    const size_t at = s.find(" on ");
    if (at == std::string::npos) continue;
    const size_t end = s.find_first_of(" \n", at + 4);
    if (end != std::string::npos) a.address = s.substr(at + 4, end - at - 4);
  }
  return a;
}

struct ClientStats {
  std::vector<double> latency_s;
  int64_t estimates = 0, sessions = 0, errors = 0;
  std::string first_error;
};

// One client: its own channel, batch and random stream.
class Client {
 public:
  Client(const std::string& address, int index, bool gemm_ok, bool prefill_ok)
      : stub_(v1::DeviceAgent::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        rng_(0x5e5e + index),
        next_id_(int64_t{index} << 40),
        gemm_ok_(gemm_ok),
        prefill_ok_(prefill_ok) {}

  void Run(Clock::time_point until, ClientStats* stats) {
    while (Clock::now() < until) {
      Estimate(stats);
      if (++iteration_ % 8 == 0) Session(stats);
    }
  }

 private:
  struct Seq {
    int64_t id, past, left;
  };

  template <typename F>
  bool Call(ClientStats* stats, const char* what, F call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const auto t0 = Clock::now();
    const grpc::Status st = call(&ctx);
    stats->latency_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!st.ok()) {
      if (stats->errors++ == 0) {
        stats->first_error = absl::StrCat(what, ": ", st.error_code(), " ", st.error_message());
      }
      return false;
    }
    return true;
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void Estimate(ClientStats* stats) {
    // Finished requests leave; new ones (fresh ids) join up to a target batch.
    batch_.erase(std::remove_if(batch_.begin(), batch_.end(),
                                [](const Seq& s) { return s.left <= 0; }),
                 batch_.end());
    if (batch_.empty() || Uniform(0, 3) == 0) target_ = Uniform(1, 32);
    while (static_cast<int64_t>(batch_.size()) < target_) {
      batch_.push_back({next_id_++, Uniform(0, 3000), Uniform(1, 400)});
    }
    const bool prefill = prefill_ok_ && Uniform(0, 3) == 0;
    v1::EstimateRequest req;
    v1::SeqList* l = req.add_seq_lists();
    for (size_t i = 0; i < batch_.size(); ++i) {
      const bool chunk = prefill && i == 0;
      l->add_new_tokens(chunk ? Uniform(2, 512) : 1);
      l->add_past_tokens(batch_[i].past);
      l->add_request_id(batch_[i].id);
    }
    // GPT-3 175B on an 8-way tensor-parallel replica: 12 heads of 128 per
    // xPU, in two head groups that share the sequence list.
    for (int g = 0; g < 2; ++g) {
      v1::Op* op = req.add_ops();
      op->set_kind(v1::OP_KIND_ATTENTION);
      op->set_stage(v1::STAGE_ATTENTION);
      op->set_heads(12);
      op->set_kv_heads(12);
      op->set_d_head(128);
      op->set_seq_list(0);
      op->set_stack_list(-1);
      op->set_head_begin(6 * g);
      op->set_head_end(6 * g + 6);
    }
    if (gemm_ok_) {
      v1::Op* op = req.add_ops();
      op->set_kind(v1::OP_KIND_GEMM);
      op->set_stage(v1::STAGE_FF1);
      op->set_m(static_cast<int64_t>(batch_.size()));
      op->set_n(6144);
      op->set_k(12288);
      op->set_seq_list(-1);
      op->set_stack_list(-1);
    }
    if (!prefill) req.set_lookahead(8);
    v1::EstimateResponse resp;
    Call(stats, "Estimate", [&](grpc::ClientContext* ctx) {
      return stub_->Estimate(ctx, req, &resp);
    });
    ++stats->estimates;
    for (Seq& s : batch_) {
      ++s.past;
      --s.left;
    }
  }

  void Session(ClientStats* stats) {
    ++stats->sessions;
    constexpr int64_t kKvHeads = 2, kHeads = 4, kDHead = 64;
    v1::OpenSessionRequest open;
    open.set_request_id(next_id_++);
    open.set_kv_heads(kKvHeads);
    open.set_d_head(kDHead);
    open.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse opened;
    if (!Call(stats, "OpenSession", [&](grpc::ClientContext* ctx) {
          return stub_->OpenSession(ctx, open, &opened);
        })) {
      return;
    }
    const int64_t n = Uniform(16, 128);
    v1::AppendKvRequest append;
    append.set_session_id(opened.session_id());
    for (v1::Tensor* t : {append.mutable_k(), append.mutable_v()}) {
      t->set_type(v1::ELEMENT_TYPE_FP16);
      for (int64_t d : {kKvHeads, n, kDHead}) t->add_shape(d);
      std::string data(static_cast<size_t>(kKvHeads * n * kDHead * 2), '\0');
      // fp16 values in [0.5, 1): exponent 0x38, random mantissa.
      for (size_t i = 0; i < data.size(); i += 2) {
        data[i] = static_cast<char>(Uniform(0, 255));
        data[i + 1] = static_cast<char>(0x38 | Uniform(0, 3));
      }
      t->set_data(std::move(data));
    }
    append.set_expected_kv_len(0);
    v1::AppendKvResponse appended;
    bool ok = Call(stats, "AppendKv", [&](grpc::ClientContext* ctx) {
      return stub_->AppendKv(ctx, append, &appended);
    });
    if (ok) {
      v1::StepRequest step;
      step.set_session_id(opened.session_id());
      step.set_expected_kv_len(n);
      v1::Tensor* q = step.mutable_q();
      q->set_type(v1::ELEMENT_TYPE_FP16);
      for (int64_t d : {kHeads, int64_t{1}, kDHead}) q->add_shape(d);
      q->set_data(std::string(static_cast<size_t>(kHeads * kDHead * 2), '\x3c'));
      v1::StepResponse stepped;
      Call(stats, "Step",
           [&](grpc::ClientContext* ctx) { return stub_->Step(ctx, step, &stepped); });
    }
    v1::CloseSessionRequest close;
    close.set_session_id(opened.session_id());
    v1::CloseSessionResponse closed;
    Call(stats, "CloseSession",
         [&](grpc::ClientContext* ctx) { return stub_->CloseSession(ctx, close, &closed); });
  }

  std::unique_ptr<v1::DeviceAgent::Stub> stub_;
  std::mt19937_64 rng_;
  int64_t next_id_;
  bool gemm_ok_, prefill_ok_;
  std::vector<Seq> batch_;
  int64_t target_ = 1;
  int64_t iteration_ = 0;
};

struct Totals {
  std::vector<double> latency_s;
  int64_t estimates = 0, sessions = 0, errors = 0;
  std::string first_error;
};

Totals RunLoad(const std::string& address, int clients, bool gemm_ok, bool prefill_ok,
               double seconds) {
  std::vector<ClientStats> stats(clients);
  std::vector<std::thread> threads;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] { Client(address, i, gemm_ok, prefill_ok).Run(until, &stats[i]); });
  }
  for (auto& t : threads) t.join();
  Totals t;
  for (ClientStats& s : stats) {
    t.latency_s.insert(t.latency_s.end(), s.latency_s.begin(), s.latency_s.end());
    t.estimates += s.estimates;
    t.sessions += s.sessions;
    t.errors += s.errors;
    if (t.first_error.empty()) t.first_error = s.first_error;
  }
  std::sort(t.latency_s.begin(), t.latency_s.end());
  return t;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage(flag + " needs a value");
    const std::string v = argv[++i];
    bool ok = true;
    if (flag == "--agent") {
      o.agent = v;
    } else if (flag == "--device") {
      o.device = v;
    } else if (flag == "--clients") {
      ok = absl::SimpleAtoi(v, &o.clients) && o.clients >= 1 && o.clients <= 1024;
    } else if (flag == "--seconds") {
      ok = absl::SimpleAtod(v, &o.seconds) && o.seconds > 0 && o.seconds <= 86400;
    } else if (flag == "--warmup") {
      ok = absl::SimpleAtod(v, &o.warmup_s) && o.warmup_s >= 0 && o.warmup_s <= 3600;
    } else if (flag == "--max-rss-growth-mib") {
      ok = absl::SimpleAtod(v, &o.max_growth_mib) && o.max_growth_mib >= 0;
    } else {
      return Usage("unknown flag " + flag);
    }
    if (!ok) {
      return Usage(absl::StrCat(flag, " ", v,
                                ": expected --clients 1..1024, --seconds (0, 86400], "
                                "--warmup 0..3600, --max-rss-growth-mib >= 0"));
    }
  }
  if (o.agent.empty()) return Usage("--agent PATH is required");

  char dir_template[] = "/tmp/servesim-agent-load-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return Usage("cannot create a temporary folder");
  const std::string log = absl::StrCat(dir, "/agent.log");
  Agent agent = StartAgent(o, log);
  auto stop_agent = [&](int sig) {
    if (agent.pid <= 0) return -1;
    kill(agent.pid, sig);
    int status = 0;
    waitpid(agent.pid, &status, 0);
    agent.pid = -1;
    return status;
  };
  if (agent.address.empty()) {
    std::cerr << "servesim-agent-load: the agent did not start; its log (" << log << "):\n";
    std::ifstream in(log);
    std::cerr << in.rdbuf();
    stop_agent(SIGKILL);
    return 1;
  }

  // Which ops the device takes: attention always; GEMM if it says so.
  bool gemm_ok = false;
  {
    auto stub = v1::DeviceAgent::NewStub(
        grpc::CreateChannel(agent.address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::DescribeResponse d;
    const grpc::Status st = stub->Describe(&ctx, v1::DescribeRequest(), &d);
    if (!st.ok()) {
      std::cerr << "servesim-agent-load: Describe failed: " << st.error_message() << "\n";
      stop_agent(SIGKILL);
      return 1;
    }
    for (int k : d.accepts()) gemm_ok |= k == v1::OP_KIND_GEMM;
  }

  const bool prefill_ok = o.device == "gpu";
  if (o.warmup_s > 0) RunLoad(agent.address, o.clients, gemm_ok, prefill_ok, o.warmup_s);
  const double rss_before = RssMib(agent.pid);
  const auto t0 = Clock::now();
  Totals t = RunLoad(agent.address, o.clients, gemm_ok, prefill_ok, o.seconds);
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rss_after = RssMib(agent.pid);
  const double rss_peak = RssMib(agent.pid, "VmHWM:");
  const int status = stop_agent(SIGTERM);
  const bool clean_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;

  const double growth = rss_after - rss_before;
  const bool pass =
      t.errors == 0 && rss_before > 0 && rss_after > 0 && growth <= o.max_growth_mib && clean_exit;
  const int64_t calls = static_cast<int64_t>(t.latency_s.size());
  std::cout << absl::StrFormat(
      "servesim-agent-load: %s agent, %d clients, %.1f s (after %.1f s of warm-up)\n"
      "  calls      %d (%.0f calls/s): %d Estimate, %d sessions (4 calls each)\n"
      "  latency    p50 %.3f ms, p99 %.3f ms, max %.3f ms\n"
      "  errors     %d%s\n"
      "  agent RSS  before %.1f MiB, after %.1f MiB, growth %.1f MiB (bound %.1f MiB), peak "
      "%.1f MiB\n"
      "  agent exit %s\n"
      "  result     %s\n",
      o.device, o.clients, elapsed, o.warmup_s, calls, calls / elapsed, t.estimates,
      t.sessions, 1e3 * Percentile(t.latency_s, 0.50), 1e3 * Percentile(t.latency_s, 0.99),
      t.latency_s.empty() ? 0.0 : 1e3 * t.latency_s.back(), t.errors,
      t.errors > 0 ? absl::StrCat(" (first: ", t.first_error, ")") : "", rss_before, rss_after,
      growth, o.max_growth_mib, rss_peak, clean_exit ? "0 after SIGTERM" : "NOT CLEAN",
      pass ? "PASS" : "FAIL");
  if (clean_exit) {
    std::remove(log.c_str());
    rmdir(dir);
  }
  return pass ? 0 : 1;
}
