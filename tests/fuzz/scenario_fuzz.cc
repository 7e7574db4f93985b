// libFuzzer target: the scenario pipeline `servesim validate` runs
// (scenario/scenario.h): parse (protobuf text) -> --set overrides ->
// normalise -> resolve, then the workload it describes (workload/workload.h).
//
// Input: a scenario in text format. Comment lines of the form
// `#set field.path=value` are also applied, in order, as `--set` overrides
// (the parser ignores them as comments, so seeds stay valid scenarios).
// Fields that name files or network endpoints (trace and length-CSV paths,
// capture folders, agent endpoints, the output folder) are cleared before
// resolution: the harness exercises the parser and validator, not the
// machine's file system or network. Pruning devices' `fidelity` is set to
// ANALYTIC: CALIBRATED and FULL run the device's kernels at resolution
// (1-2 s per scenario in a Release build, minutes under the sanitizers), a
// cost of device creation, not of validating the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "scenario/scenario.h"
#include "workload/workload.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "servesim/v1/hardware.pb.h"

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

bool NamesOutsideWorld(const FieldDescriptor* f) {
  const std::string& n = f->name();
  return f->type() == FieldDescriptor::TYPE_STRING &&
         (n == "path" || n == "sampled_from" || n == "dir" || n == "npy_dir" ||
          absl::EndsWith(n, "endpoints"));
}

void Confine(Message* m) {
  const Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (NamesOutsideWorld(f)) {
      r->ClearField(m, f);
    } else if (f->name() == "fidelity" && f->type() == FieldDescriptor::TYPE_ENUM &&
               !f->is_repeated()) {
      r->SetEnumValue(m, f, servesim::v1::PRUNE_FIDELITY_ANALYTIC);
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*m, f); ++i) {
          Confine(r->MutableRepeatedMessage(m, f, i));
        }
      } else {
        Confine(r->MutableMessage(m, f));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sc = servesim::scenario;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto loaded = sc::ParseScenarioText(text, "fuzz.pbtxt");
  if (!loaded.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "#set ")) {
      if (!sc::ApplyOverride(&*loaded, line).ok()) return 0;
    }
  }
  Confine(&loaded->proto);
  if (!sc::Normalize(&*loaded).ok()) return 0;
  Confine(&loaded->proto);  // presets name no files, but be sure
  auto resolved = sc::Resolve(*loaded);
  if (!resolved.ok()) return 0;
  auto workload = servesim::workload::LoadWorkload(resolved->proto.workload(), "", "", resolved->seed);
  if (workload.ok()) {
    for (size_t i = 0; i < workload->requests.size(); ++i) {
      if (i > 0 && workload->requests[i].arrival_s < workload->requests[i - 1].arrival_s) {
        std::abort();  // LoadWorkload promises arrival order
      }
    }
  }
  return 0;
}
