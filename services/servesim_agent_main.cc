// servesim-agent: one registered device kind served over gRPC
// (proto/servesim/v1/agent.proto). Flag parsing and signal handling only;
// the service is agents/agent_service.h.
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/logging.h"
#include "common/status_macros.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "google/protobuf/text_format.h"
#include "services/accept_guard.h"

namespace {

constexpr char kUsage[] = R"(servesim-agent - serve one servesim device over gRPC

Usage:
  servesim-agent --device KIND [--preset NAME | --config FILE] [options]

  --device KIND          a registered device kind: gpu, attacc, topick, spatten,
                         cta, lad
  --preset NAME          the kind's hardware preset (servesim presets); default:
                         gpu a100-80gb, attacc attacc_bank, topick topick,
                         spatten spatten, cta cta_0, lad lad_1.5
  --config FILE          a servesim.v1.DeviceSpec in protobuf text format
                         (schema: proto/servesim/v1/hardware.proto)
  --listen HOST:PORT     default 127.0.0.1:50051 (loopback); port 0: any free
                         (the address is printed on stderr). Use 0.0.0.0:PORT
                         or a host address to serve other hosts
  --tls-cert FILE        server certificate chain (PEM); with --tls-key: TLS
  --tls-key FILE         its private key (PEM)
  --tls-client-ca FILE   require client certificates signed by this CA
  --token-file FILE      require 'authorization: Bearer <token>' on every call;
                         the token is the file's first line (or set
                         SERVESIM_AGENT_TOKEN): 1-4096 printable ASCII
                         characters, no spaces; an empty one is an error
  --max-message-bytes N  largest gRPC message in or out (default 268435456)
  --max-tensor-bytes N   largest tensor accepted (default 67108864):
                         RESOURCE_EXHAUSTED above it
  --max-kv-bytes N       all sessions' K and V together (default 4294967296):
                         RESOURCE_EXHAUSTED on an append above it
  --max-connections N    connections open at once (default 1024); more are
                         closed at accept, and the agent accepts again as
                         they leave
  --max-streams N        calls in flight per connection (default 100)
  --max-threads N        handler threads (default 64); a call finding none
                         free is RESOURCE_EXHAUSTED
  --stream-threads N     threads serving estimate streams (default 1: one
                         thread reads, answers and writes, with no hand-off
                         per message; more serve several clients' streams on
                         several cores), in [1, 64]
  --handshake-timeout-s S  close a connection that has not completed its TLS
                         handshake within S s (default 10)
  --idle-connection-s S  close a connection with no call in flight for S s,
                         including one that never sent a byte (default 300)
  --call-budget-s S      stop an Execute/Step kernel after S s of work
                         (RESOURCE_EXHAUSTED; default 60). A kernel also stops
                         when its caller cancels or its deadline passes
  --session-idle-s S     close a session unused for S s (default 600)
  --estimate-streams-per-client N  estimate streams one caller may hold open
                         (default 4; a quarter of --max-threads in all)
  --estimate-stream-idle-s S  end an estimate stream that brings no request
                         for S s (default 60)
  --sessions-per-client N  sessions one caller may hold (default 1024; 4096
                         in all)
  --grace S              on SIGTERM/SIGINT, let in-flight calls finish for up
                         to S seconds (default 30)
  --log-level LEVEL      gRPC's own log lines: quiet (default), error, warning,
                         info or debug

The simulator binds the scenario's own device spec on the agent (Describe with
a spec of this kind); --preset/--config is the device served to callers that
send none. Exit status: 0 after a clean shutdown, 1 bad input, 2 bad command line.
)";

int UsageError(const std::string& msg) {
  std::cerr << "servesim-agent: " << msg << "\nRun 'servesim-agent --help' for usage.\n";
  return 2;
}

int Fail(const absl::Status& st) {
  std::cerr << "servesim-agent: error: " << st.message() << "\n";
  return 1;
}

absl::StatusOr<std::string> ReadText(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What the command line asks for.
struct AgentFlags {
  std::string kind, preset, config, token_file;
  servesim::agents::AgentServerOptions server;
  servesim::agents::AgentServiceOptions service;
  double grace_s = 30;
  int max_connections = 1024;
};

// Parses the options into `f`; an exit status where the command ends here
// (--help, a usage error).
std::optional<int> ParseFlags(const std::vector<std::string>& args, AgentFlags* f) {
  f->server.listen = "127.0.0.1:50051";
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], v;
    const size_t eq = a.find('=');
    const bool inline_value = absl::StartsWith(a, "--") && eq != std::string::npos;
    const std::string flag = inline_value ? a.substr(0, eq) : a;
    auto get = [&]() -> bool {
      if (inline_value) {
        v = a.substr(eq + 1);
        return true;
      }
      if (i + 1 >= args.size()) return false;
      v = args[++i];
      return true;
    };
    int64_t n = 0;
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (flag == "--device") {
      if (!get()) return UsageError("--device needs a kind");
      f->kind = v;
    } else if (flag == "--preset") {
      if (!get()) return UsageError("--preset needs a name");
      f->preset = v;
    } else if (flag == "--config") {
      if (!get()) return UsageError("--config needs a file");
      f->config = v;
    } else if (flag == "--listen") {
      const size_t colon = get() ? v.rfind(':') : std::string::npos;
      int port = -1;
      if (colon == std::string::npos || colon == 0 ||
          !absl::SimpleAtoi(v.substr(colon + 1), &port) || port < 0 || port > 65535) {
        return UsageError(
            absl::StrCat("--listen ", v, ": expected HOST:PORT with PORT in [0, 65535]"));
      }
      f->server.listen = v;
    } else if (flag == "--tls-cert") {
      if (!get()) return UsageError("--tls-cert needs a file");
      f->server.tls_cert_file = v;
    } else if (flag == "--tls-key") {
      if (!get()) return UsageError("--tls-key needs a file");
      f->server.tls_key_file = v;
    } else if (flag == "--tls-client-ca") {
      if (!get()) return UsageError("--tls-client-ca needs a file");
      f->server.tls_client_ca_file = v;
    } else if (flag == "--token-file") {
      if (!get()) return UsageError("--token-file needs a file");
      f->token_file = v;
    } else if (flag == "--max-message-bytes") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1024 || n > (int64_t{1} << 31) - 1) {
        return UsageError("--max-message-bytes needs an integer in [1024, 2147483647]");
      }
      f->server.max_message_bytes = static_cast<int>(n);
    } else if (flag == "--max-tensor-bytes") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1) {
        return UsageError("--max-tensor-bytes needs an integer >= 1");
      }
      f->service.max_tensor_bytes = n;
    } else if (flag == "--max-kv-bytes") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1) {
        return UsageError("--max-kv-bytes needs an integer >= 1");
      }
      f->service.max_kv_bytes = n;
    } else if (flag == "--max-connections") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1 || n > (1 << 20)) {
        return UsageError("--max-connections needs an integer in [1, 1048576]");
      }
      f->max_connections = static_cast<int>(n);
    } else if (flag == "--max-streams") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1 || n > 65536) {
        return UsageError("--max-streams needs an integer in [1, 65536]");
      }
      f->server.max_streams_per_connection = static_cast<int>(n);
    } else if (flag == "--max-threads") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 2 || n > 4096) {
        return UsageError("--max-threads needs an integer in [2, 4096]");
      }
      f->server.max_threads = static_cast<int>(n);
    } else if (flag == "--stream-threads") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1 || n > 64) {
        return UsageError("--stream-threads needs an integer in [1, 64]");
      }
      f->server.stream_threads = static_cast<int>(n);
    } else if (flag == "--sessions-per-client") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1 || n > 4096) {
        return UsageError("--sessions-per-client needs an integer in [1, 4096]");
      }
      f->service.max_sessions_per_client = static_cast<int>(n);
    } else if (flag == "--estimate-streams-per-client") {
      if (!get() || !absl::SimpleAtoi(v, &n) || n < 1 || n > 4096) {
        return UsageError("--estimate-streams-per-client needs an integer in [1, 4096]");
      }
      f->service.estimate_streams_per_client = static_cast<int>(n);
    } else if (flag == "--handshake-timeout-s" || flag == "--idle-connection-s" ||
               flag == "--call-budget-s" || flag == "--session-idle-s" ||
               flag == "--estimate-stream-idle-s") {
      double s = 0;
      const double hi = flag == "--handshake-timeout-s" ? 3600 : 86400;
      if (!get() || !absl::SimpleAtod(v, &s) || !(s > 0 && s <= hi)) {
        return UsageError(absl::StrCat(flag, " needs seconds in (0, ", hi, "]"));
      }
      (flag == "--handshake-timeout-s" ? f->server.handshake_timeout_s
       : flag == "--idle-connection-s" ? f->server.idle_connection_s
       : flag == "--call-budget-s"     ? f->service.call_budget_s
       : flag == "--session-idle-s"    ? f->service.session_idle_s
                                       : f->service.estimate_stream_idle_s) = s;
    } else if (flag == "--grace") {
      if (!get() || !absl::SimpleAtod(v, &f->grace_s) ||
          !(f->grace_s >= 0 && f->grace_s <= 86400)) {
        return UsageError("--grace needs seconds in [0, 86400]");
      }
    } else {
      return UsageError(absl::StrCat("unknown option ", a));
    }
  }
  if (f->kind.empty()) return UsageError("--device KIND is required");
  if (!f->preset.empty() && !f->config.empty()) {
    return UsageError("give --preset or --config, not both");
  }
  return std::nullopt;
}

// The device served to callers that send no spec: --config's, else the
// kind's preset.
absl::Status LoadSpec(AgentFlags* f) {
  const std::string& kind = f->kind;
  const std::string& config = f->config;
  servesim::agents::AgentServiceOptions& service = f->service;
  if (!config.empty()) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(config, "--config"));
    if (!google::protobuf::TextFormat::ParseFromString(text, &service.spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", config, ": not a servesim.v1.DeviceSpec in text format"));
    }
    if (servesim::agents::SpecKindName(service.spec) != kind) {
      return absl::InvalidArgumentError(absl::StrCat("--config ", config, " describes a '",
                                                     servesim::agents::SpecKindName(service.spec),
                                                     "' device; --device is ", kind));
    }
  } else {
    ASSIGN_OR_RETURN(service.spec, servesim::agents::AgentPresetSpec(kind, f->preset));
  }
  return absl::OkStatus();
}

// The token every call must carry: --token-file's first line, else
// SERVESIM_AGENT_TOKEN; none if neither is given.
absl::Status LoadToken(AgentFlags* f) {
  const std::string& token_file = f->token_file;
  servesim::agents::AgentServiceOptions& service = f->service;
  if (!token_file.empty()) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(token_file, "--token-file"));
    service.token = text.substr(0, text.find('\n'));
    if (absl::EndsWith(service.token, "\r")) service.token.pop_back();
    RETURN_IF_ERROR(servesim::agents::CheckToken(
        service.token, absl::StrCat("--token-file ", token_file, " (first line)")));
  } else if (const char* env = std::getenv("SERVESIM_AGENT_TOKEN"); env != nullptr) {
    // Set but empty is a mistake (an unset shell variable), not "no token".
    service.token = env;
    RETURN_IF_ERROR(servesim::agents::CheckToken(service.token, "SERVESIM_AGENT_TOKEN"));
  }
  return absl::OkStatus();
}

// Says where the agent serves, warning first when it serves other hosts
// without TLS or a token.
void ReportServing(const AgentFlags& f, int port) {
  const servesim::agents::AgentServerOptions& server = f.server;
  const servesim::agents::AgentServiceOptions& service = f.service;
  const std::string host = server.listen.substr(0, server.listen.rfind(':'));
  const bool loopback = absl::StartsWith(host, "127.") || host == "localhost" || host == "[::1]" ||
                        host == "::1" || host == "ip6-localhost";
  if (!loopback && (server.tls_cert_file.empty() || service.token.empty())) {
    std::cerr << "servesim-agent: warning: serving " << host << " without "
              << (server.tls_cert_file.empty() && service.token.empty() ? "TLS or a token"
                  : server.tls_cert_file.empty()                        ? "TLS"
                                                                        : "a token")
              << ": any host that reaches this port can use the agent"
              << (server.tls_cert_file.empty() ? " and read its traffic" : "")
              << " (--tls-cert/--tls-key, --token-file)" << std::endl;
  }
  std::cerr << "servesim-agent: serving " << f.kind << " on " << host << ":" << port
            << (server.tls_cert_file.empty() ? "" : " (TLS)")
            << (service.token.empty() ? "" : " (token)") << std::endl;
}

// Ends the estimate streams, then lets in-flight calls finish for up to
// grace_s before the server stops.
void Shutdown(servesim::agents::AgentService* svc, servesim::agents::RunningAgent* running,
              double grace_s) {
  // An open estimate stream is a call in flight until its client closes it:
  // end them now (their clients call Estimate meanwhile, or another agent).
  svc->EndStreams();
  running->health->Shutdown();
  running->server->Shutdown(std::chrono::system_clock::now() +
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::duration<double>(grace_s)));
  std::cerr << "servesim-agent: stopped after " << svc->calls() << " calls";
  if (const int64_t refused = servesim::services::RefusedConnections(); refused > 0) {
    std::cerr << "; " << refused << " connections refused over --max-connections";
  }
  std::cerr << std::endl;
}

// Serves until SIGTERM or SIGINT, then shuts down; the exit status.
int Serve(AgentFlags* f) {
  servesim::agents::AgentServerOptions& server = f->server;
  servesim::agents::AgentServiceOptions& service = f->service;
  // Signals are taken by sigwait below, never by a handler: block them
  // before gRPC starts its threads so they inherit the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  // Open streams are bounded as handler threads are: a quarter as many.
  service.max_estimate_streams = std::max(1, server.max_threads / 4);
  auto svc = servesim::agents::AgentService::Create(service);
  if (!svc.ok()) return Fail(svc.status());
  auto running = servesim::agents::StartAgentServer(svc->get(), server);
  if (!running.ok()) return Fail(running.status());
  auto guard = servesim::services::InstallAcceptGuard(f->max_connections);
  if (!guard.ok()) return Fail(guard.status());
  if (!guard->note.empty()) std::cerr << "servesim-agent: warning: " << guard->note << std::endl;
  ReportServing(*f, running->port);
  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "servesim-agent: signal " << sig << ", finishing in-flight calls" << std::endl;
  Shutdown(svc->get(), &*running, f->grace_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detection on: every lock of gRPC's mutexes updates a graph of
  // lock orders (2-4% of an agent's and its client's CPU). servesim's own
  // locking is std::mutex, which never had it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // gRPC's poll() engine instead of its default epoll1, unless the caller
  // chose one: with the synchronous server's threads, epoll1 hands every
  // call between threads; poll() took the loopback AttAcc hour from
  // 8.61-8.77 s to 7.63-8.03 s (docs/agents.md, Cost). Its per-wake-up scan
  // of every descriptor stays small under --max-connections.
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  std::vector<std::string> args(argv + 1, argv + argc);
  // --log-level: gRPC's own log lines (quiet by default).
  if (absl::Status st = servesim::agents::TakeLogLevelFlag(&args); !st.ok()) {
    return UsageError(std::string(st.message()));
  }
  AgentFlags flags;
  if (std::optional<int> exit_status = ParseFlags(args, &flags)) return *exit_status;
  if (absl::Status st = LoadSpec(&flags); !st.ok()) return Fail(st);
  if (absl::Status st = LoadToken(&flags); !st.ok()) return Fail(st);
  return Serve(&flags);
}
