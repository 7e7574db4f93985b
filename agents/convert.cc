#include "agents/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using devices::Op;
using devices::OpKind;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::OpKind EncodeOpKind(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
      return v1::OP_KIND_GEMM;
    case OpKind::kAttention:
      return v1::OP_KIND_ATTENTION;
    case OpKind::kElementwise:
      return v1::OP_KIND_ELEMENTWISE;
    case OpKind::kAllReduce:
      return v1::OP_KIND_ALL_REDUCE;
    case OpKind::kMoe:
      return v1::OP_KIND_MOE;
  }
  return v1::OP_KIND_UNSPECIFIED;
}

namespace {

template <typename T>
struct SpanKey {
  const T* data;
  size_t size;
  bool operator==(const SpanKey& o) const { return data == o.data && size == o.size; }
  template <typename H>
  friend H AbslHashValue(H h, const SpanKey& k) {
    return H::combine(std::move(h), k.data, k.size);
  }
};

}  // namespace

void EncodeOps(absl::Span<const Op> ops, v1::EstimateRequest* request) {
  absl::flat_hash_map<SpanKey<devices::AttentionSeq>, int> seq_index;
  absl::flat_hash_map<SpanKey<int32_t>, int> stack_index;
  for (const Op& op : ops) {
    v1::Op* o = request->add_ops();
    o->set_kind(EncodeOpKind(op.kind));
    o->set_stage(static_cast<v1::Stage>(static_cast<int>(op.stage)));
    o->set_m(op.m);
    o->set_n(op.n);
    o->set_k(op.k);
    o->set_heads(op.heads);
    o->set_kv_heads(op.kv_heads);
    o->set_d_head(op.d_head);
    o->set_head_begin(op.head_begin);
    o->set_head_end(op.head_end);
    o->set_elements(op.elements);
    o->set_bytes_per_element(op.bytes_per_element);
    o->set_flops_per_element(op.flops_per_element);
    o->set_bytes(op.bytes);
    o->set_participants(op.participants);
    o->set_tokens(op.tokens);
    o->set_sequences(op.sequences);
    if (op.kind == OpKind::kMoe) {
      o->set_routed(op.routed);
      o->set_experts_touched(op.experts_touched);
      o->set_experts_total(op.experts_total);
      o->set_top_k(op.top_k);
      o->set_expert_matrices(op.expert_matrices);
    }
    o->set_window(op.window);
    if (op.kv_latent > 0) {
      o->set_kv_latent(op.kv_latent);
      o->set_d_rope(op.d_rope);
      o->set_d_value(op.d_value);
    }
    o->set_seq_list(-1);
    o->set_stack_list(-1);
    if (!op.seqs.empty()) {
      auto [it, added] =
          seq_index.try_emplace(SpanKey<devices::AttentionSeq>{op.seqs.data(), op.seqs.size()},
                                request->seq_lists_size());
      if (added) {
        v1::SeqList* l = request->add_seq_lists();
        l->mutable_new_tokens()->Reserve(op.seqs.size());
        l->mutable_past_tokens()->Reserve(op.seqs.size());
        l->mutable_request_id()->Reserve(op.seqs.size());
        for (const devices::AttentionSeq& s : op.seqs) {
          l->add_new_tokens(s.new_tokens);
          l->add_past_tokens(s.past_tokens);
          l->add_request_id(s.request_id);
        }
      }
      o->set_seq_list(it->second);
    }
    if (!op.kv_head_stack.empty()) {
      auto [it, added] = stack_index.try_emplace(
          SpanKey<int32_t>{op.kv_head_stack.data(), op.kv_head_stack.size()},
          request->stack_lists_size());
      if (added) {
        request->add_stack_lists()->mutable_stack()->Add(op.kv_head_stack.begin(),
                                                         op.kv_head_stack.end());
      }
      o->set_stack_list(it->second);
    }
  }
}

namespace {

// The request's size limits: ops, sequences and stack entries in all.
absl::Status CheckRequestSize(const v1::EstimateRequest& request) {
  if (request.ops_size() > kMaxOps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ops: ", request.ops_size(), " ops; expected at most ", kMaxOps, " per request"));
  }
  int64_t sequences = 0, stack_entries = 0;
  for (const v1::SeqList& l : request.seq_lists()) sequences += l.new_tokens_size();
  for (const v1::StackList& l : request.stack_lists()) stack_entries += l.stack_size();
  if (sequences > kMaxSequences) {
    return absl::InvalidArgumentError(absl::StrCat("seq_lists: ", sequences,
                                                   " sequences in all; expected at most ",
                                                   kMaxSequences, " per request"));
  }
  if (stack_entries > kMaxStackEntries) {
    return absl::InvalidArgumentError(absl::StrCat("stack_lists: ", stack_entries,
                                                   " entries in all; expected at most ",
                                                   kMaxStackEntries, " per request"));
  }
  return absl::OkStatus();
}

// The request's sequence and stack lists, checked, into `out`.
absl::Status DecodeLists(const v1::EstimateRequest& request, DecodedOps* out) {
  for (int i = 0; i < request.seq_lists_size(); ++i) {
    const v1::SeqList& l = request.seq_lists(i);
    const int n = l.new_tokens_size();
    if (l.past_tokens_size() != n || l.request_id_size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_lists[", i,
                       "]: new_tokens, past_tokens and request_id must have one entry per "
                       "sequence; got ",
                       n, ", ", l.past_tokens_size(), " and ", l.request_id_size()));
    }
    auto& seqs = out->seq_lists.emplace_back(n);
    for (int s = 0; s < n; ++s) {
      if (l.new_tokens(s) < 1 || l.past_tokens(s) < 0 || l.new_tokens(s) > kMaxContextTokens ||
          l.past_tokens(s) > kMaxContextTokens - l.new_tokens(s)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "seq_lists[", i, "] sequence ", s, ": new_tokens = ", l.new_tokens(s),
            ", past_tokens = ", l.past_tokens(s), "; expected new_tokens >= 1, past_tokens >= 0 ",
            "and new_tokens + past_tokens <= ", kMaxContextTokens));
      }
      seqs[s] = {l.new_tokens(s), l.past_tokens(s), l.request_id(s)};
    }
  }
  for (int i = 0; i < request.stack_lists_size(); ++i) {
    const auto& st = request.stack_lists(i).stack();
    out->stack_lists.emplace_back(st.begin(), st.end());
  }
  return absl::OkStatus();
}

// ops[i]'s kind, or UNIMPLEMENTED for one this protocol version does not know.
absl::Status DecodeKind(const v1::Op& o, int i, Op* op) {
  switch (o.kind()) {
    case v1::OP_KIND_GEMM:
      op->kind = OpKind::kGemm;
      break;
    case v1::OP_KIND_ATTENTION:
      op->kind = OpKind::kAttention;
      break;
    case v1::OP_KIND_ELEMENTWISE:
      op->kind = OpKind::kElementwise;
      break;
    case v1::OP_KIND_ALL_REDUCE:
      op->kind = OpKind::kAllReduce;
      break;
    case v1::OP_KIND_MOE:
      op->kind = OpKind::kMoe;
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("ops[", i, "].kind = ", static_cast<int>(o.kind()),
                       ": unknown op kind; this agent implements GEMM (1), ATTENTION (2), "
                       "ELEMENTWISE (3), ALL_REDUCE (4) and MOE (5)"));
  }
  return absl::OkStatus();
}

// ops[i]'s stage and the sizes every kind has, checked against the limits.
absl::Status DecodeSizes(const v1::Op& o, int i, Op* op) {
  if (o.stage() < 0 || o.stage() >= devices::kNumStages) {
    return absl::InvalidArgumentError(absl::StrCat("ops[", i, "].stage = ", o.stage(),
                                                   "; expected 0..", devices::kNumStages - 1));
  }
  op->stage = static_cast<devices::Stage>(o.stage());
  if (o.m() < 0 || o.n() < 0 || o.k() < 0 || o.heads() < 0 || o.kv_heads() < 0 || o.d_head() < 0 ||
      o.elements() < 0 || o.participants() < 0 || o.bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ops[", i,
        "]: m, n, k, heads, kv_heads, d_head, elements, bytes and participants "
        "must be >= 0 (got m = ",
        o.m(), ", n = ", o.n(), ", k = ", o.k(), ", heads = ", o.heads(),
        ", kv_heads = ", o.kv_heads(), ", d_head = ", o.d_head(), ", elements = ", o.elements(),
        ", bytes = ", o.bytes(), ", participants = ", o.participants(), ")"));
  }
  if (o.heads() > kMaxHeads || o.kv_heads() > kMaxHeads || o.d_head() > kMaxDHead ||
      o.head_begin() < -kMaxHeads || o.head_begin() > kMaxHeads || o.head_end() < -kMaxHeads ||
      o.head_end() > kMaxHeads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ops[", i, "]: heads = ", o.heads(), ", kv_heads = ", o.kv_heads(),
        ", d_head = ", o.d_head(), ", head_begin = ", o.head_begin(), ", head_end = ", o.head_end(),
        "; expected heads and kv_heads 0..", kMaxHeads, ", d_head 0..", kMaxDHead,
        ", head_begin and head_end -", kMaxHeads, "..", kMaxHeads));
  }
  if (o.m() > kMaxGemmDim || o.n() > kMaxGemmDim || o.k() > kMaxGemmDim ||
      o.elements() > kMaxElements) {
    return absl::InvalidArgumentError(absl::StrCat("ops[", i, "]: m = ", o.m(), ", n = ", o.n(),
                                                   ", k = ", o.k(), ", elements = ", o.elements(),
                                                   "; expected m, n and k 0..", kMaxGemmDim,
                                                   ", elements 0..", kMaxElements));
  }
  // !(x <= max) also refuses NaN.
  if (!(o.bytes_per_element() >= 0 && o.bytes_per_element() <= kMaxPerElement) ||
      !(o.flops_per_element() >= 0 && o.flops_per_element() <= kMaxPerElement) ||
      !(o.bytes() <= kMaxAllReduceBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ops[", i, "]: bytes_per_element = ", o.bytes_per_element(),
                     ", flops_per_element = ", o.flops_per_element(), ", bytes = ", o.bytes(),
                     "; expected bytes_per_element and flops_per_element 0..", kMaxPerElement,
                     ", bytes 0..", kMaxAllReduceBytes));
  }
  op->m = o.m();
  op->n = o.n();
  op->k = o.k();
  op->heads = o.heads();
  op->kv_heads = o.kv_heads();
  op->d_head = o.d_head();
  op->head_begin = o.head_begin();
  op->head_end = o.head_end();
  op->elements = o.elements();
  op->bytes_per_element = o.bytes_per_element();
  op->flops_per_element = o.flops_per_element();
  op->bytes = o.bytes();
  op->participants = o.participants();
  if (o.tokens() < 0 || o.tokens() > kMaxGemmDim || o.sequences() < 0 ||
      o.sequences() > kMaxGemmDim) {
    return absl::InvalidArgumentError(absl::StrCat("ops[", i, "]: tokens = ", o.tokens(),
                                                   ", sequences = ", o.sequences(),
                                                   "; expected 0..", kMaxGemmDim));
  }
  op->tokens = o.tokens();
  op->sequences = o.sequences();
  return absl::OkStatus();
}

// ops[i]'s fields of some kinds only: MoE's routing, MLA's latent widths
// and the sliding window (attention).
absl::Status DecodeKindFields(const v1::Op& o, int i, Op* op) {
  if (op->kind == OpKind::kMoe) {
    if (!(o.routed() >= 0 && o.routed() <= kMaxAllReduceBytes) ||
        !(o.experts_touched() >= 0 && o.experts_touched() <= kMaxGemmDim) ||
        o.experts_total() < 1 || o.experts_total() > kMaxGemmDim || o.top_k() < 1 ||
        o.top_k() > o.experts_total() || o.expert_matrices() < 2 || o.expert_matrices() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ops[", i, "] (moe): routed = ", o.routed(), ", experts_touched = ", o.experts_touched(),
          ", experts_total = ", o.experts_total(), ", top_k = ", o.top_k(), ", expert_matrices = ",
          o.expert_matrices(), "; expected routed >= 0, experts_touched 0..", kMaxGemmDim,
          ", experts_total 1..", kMaxGemmDim, ", top_k 1..experts_total, expert_matrices 2 or 3"));
    }
    op->routed = o.routed();
    op->experts_touched = o.experts_touched();
    op->experts_total = o.experts_total();
    op->top_k = o.top_k();
    op->expert_matrices = o.expert_matrices();
  }
  if (o.kv_latent() != 0 || o.d_rope() != 0 || o.d_value() != 0) {
    if (op->kind != OpKind::kAttention || o.kv_latent() < 1 || o.kv_latent() > kMaxDHead ||
        o.d_rope() < 0 || o.d_rope() > kMaxDHead || o.d_value() < 0 || o.d_value() > kMaxDHead) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ops[", i, "]: kv_latent = ", o.kv_latent(), ", d_rope = ", o.d_rope(),
          ", d_value = ", o.d_value(), "; expected on attention ops only, kv_latent 1..", kMaxDHead,
          ", d_rope and d_value 0..", kMaxDHead));
    }
    op->kv_latent = o.kv_latent();
    op->d_rope = o.d_rope();
    op->d_value = o.d_value();
  }
  if (o.window() != 0) {
    if (op->kind != OpKind::kAttention || o.window() < 0 || o.window() > kMaxGemmDim) {
      return absl::InvalidArgumentError(absl::StrCat("ops[", i, "]: window = ", o.window(),
                                                     "; expected on attention ops only, 0..",
                                                     kMaxGemmDim));
    }
    op->window = o.window();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeOps(const v1::EstimateRequest& request, DecodedOps* out) {
  out->ops.clear();
  out->seq_lists.clear();
  out->stack_lists.clear();
  RETURN_IF_ERROR(CheckRequestSize(request));
  RETURN_IF_ERROR(DecodeLists(request, out));
  // Query tokens of each list, for the work an op naming it asks for.
  std::vector<int64_t> list_tokens;
  list_tokens.reserve(out->seq_lists.size());
  for (const auto& seqs : out->seq_lists) {
    int64_t n = 0;
    for (const devices::AttentionSeq& q : seqs) n += q.new_tokens;
    list_tokens.push_back(n);
  }
  int64_t op_sequences = 0, query_tokens = 0;
  out->ops.resize(request.ops_size());
  for (int i = 0; i < request.ops_size(); ++i) {
    const v1::Op& o = request.ops(i);
    Op& op = out->ops[i];
    RETURN_IF_ERROR(DecodeKind(o, i, &op));
    RETURN_IF_ERROR(DecodeSizes(o, i, &op));
    RETURN_IF_ERROR(DecodeKindFields(o, i, &op));
    // Lists belong to attention ops; other kinds ignore them (proto3
    // leaves an unset index at 0).
    if (op.kind == OpKind::kAttention && o.seq_list() >= 0) {
      if (o.seq_list() >= static_cast<int>(out->seq_lists.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("ops[", i, "].seq_list = ", o.seq_list(), "; expected -1 or 0..",
                         static_cast<int64_t>(out->seq_lists.size()) - 1));
      }
      op.seqs = out->seq_lists[o.seq_list()];
      op_sequences += static_cast<int64_t>(op.seqs.size());
      query_tokens += list_tokens[o.seq_list()];
      if (op_sequences > kMaxOpSequences || query_tokens > kMaxQueryTokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ops[", i, "]: the attention ops up to this one name ", op_sequences,
            " sequences with ", query_tokens, " new tokens in all; expected at most ",
            kMaxOpSequences, " sequences and ", kMaxQueryTokens, " new tokens per request"));
      }
    }
    if (op.kind == OpKind::kAttention && o.stack_list() >= 0) {
      if (o.stack_list() >= static_cast<int>(out->stack_lists.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("ops[", i, "].stack_list = ", o.stack_list(), "; expected -1 or 0..",
                         static_cast<int64_t>(out->stack_lists.size()) - 1));
      }
      op.kv_head_stack = out->stack_lists[o.stack_list()];
    }
  }
  return absl::OkStatus();
}

bool Predictable(const devices::Op& op) {
  if (op.kind != devices::OpKind::kAttention || op.seqs.empty()) return false;
  for (const devices::AttentionSeq& s : op.seqs) {
    if (s.new_tokens != 1) return false;
  }
  return true;
}

void LookaheadStep(absl::Span<const devices::Op> ops, int64_t j, std::vector<devices::Op>* step,
                   std::deque<std::vector<devices::AttentionSeq>>* lists) {
  step->clear();
  lists->clear();
  // (list address, length) -> its shifted copy.
  std::vector<std::tuple<const devices::AttentionSeq*, size_t, size_t>> made;
  for (const devices::Op& op : ops) {
    if (!Predictable(op)) continue;
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) {
      return std::get<0>(m) == op.seqs.data() && std::get<1>(m) == op.seqs.size();
    });
    if (it == made.end()) {
      lists->emplace_back(op.seqs.begin(), op.seqs.end());
      for (devices::AttentionSeq& s : lists->back()) s.past_tokens += j;
      made.emplace_back(op.seqs.data(), op.seqs.size(), lists->size() - 1);
      it = made.end() - 1;
    }
    step->push_back(op);
    step->back().seqs = (*lists)[std::get<2>(*it)];
  }
}

namespace {

// Cost's fields by their field number in agent.proto's Cost (bit f - 1 of
// a CostTable entry is field f).
constexpr double devices::Cost::*kCostFields[] = {
    &devices::Cost::time_s,
    &devices::Cost::flops,
    &devices::Cost::dram_bytes,
    &devices::Cost::link_bytes,
    &devices::Cost::compute_energy_pj,
    &devices::Cost::dram_energy_pj,
    &devices::Cost::link_energy_pj,
    &devices::Cost::bg_bus_bytes,
    &devices::Cost::tsv_bytes,
    &devices::Cost::external_bytes,
    &devices::Cost::cycles,
    &devices::Cost::score_s,
    &devices::Cost::softmax_s,
    &devices::Cost::context_s,
    &devices::Cost::internode_bytes,
};
constexpr int kCostFieldCount = static_cast<int>(std::size(kCostFields));
static_assert(sizeof(devices::Cost) == kCostFieldCount * sizeof(double),
              "every field of devices::Cost travels in a CostTable");
constexpr uint32_t kNewCost = 0x8000;  // a CostTable entry that is not a repeat
constexpr uint32_t kFieldMask = (uint32_t{1} << kCostFieldCount) - 1;

bool SameBits(const devices::Cost& a, const devices::Cost& b) {
  return std::memcmp(&a, &b, sizeof(devices::Cost)) == 0;
}

}  // namespace

void EncodeCosts(absl::Span<const devices::Cost> costs, v1::CostTable* o) {
  o->mutable_fields()->Reserve(static_cast<int>(costs.size()));
  for (size_t i = 0; i < costs.size(); ++i) {
    const devices::Cost& c = costs[i];
    if (i > 0 && SameBits(c, costs[i - 1])) {
      o->add_fields(0);
      continue;
    }
    uint32_t mask = 0;
    for (int f = 0; f < kCostFieldCount; ++f) {
      const double v = c.*kCostFields[f];
      if (std::bit_cast<uint64_t>(v) == 0) continue;
      mask |= uint32_t{1} << f;
      o->add_values(v);
    }
    o->add_fields(kNewCost | mask);
  }
}

absl::Status DecodeCostTable(const v1::CostTable& t, std::vector<devices::Cost>* unique,
                             std::vector<uint32_t>* index) {
  const size_t unique_base = unique->size(), index_base = index->size();
  auto fail = [&](absl::Status st) {
    unique->resize(unique_base);
    index->resize(index_base);
    return st;
  };
  index->reserve(index_base + static_cast<size_t>(t.fields_size()));
  int at = 0;
  for (int i = 0; i < t.fields_size(); ++i) {
    const uint32_t entry = t.fields(i);
    if (entry == 0) {
      if (i == 0) {
        return fail(absl::InvalidArgumentError(
            "cost_table.fields[0] is 0, a repeat of the cost before, but there is none"));
      }
      index->push_back(index->back());
      continue;
    }
    if ((entry & ~(kNewCost | kFieldMask)) != 0 || (entry & kNewCost) == 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "cost_table.fields[", i, "] is ", entry, ": allowed are 0 (a repeat) and ", kNewCost,
          " + a mask of Cost's field numbers 1..", kCostFieldCount, " (bit f - 1 for field f)")));
    }
    const int n = std::popcount(entry & kFieldMask);
    if (at + n > t.values_size()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("cost_table.fields[", i, "] sets ", n,
                                                          " fields but only ", t.values_size() - at,
                                                          " of cost_table.values are left")));
    }
    index->push_back(static_cast<uint32_t>(unique->size()));
    devices::Cost& c = unique->emplace_back();
    for (uint32_t m = entry & kFieldMask; m != 0; m &= m - 1) {
      // Costs are times, counts, bytes and energies: an agent's NaN, infinity
      // or negative figure would poison every sum it enters.
      const double v = t.values(at);
      if (!std::isfinite(v) || v < 0) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("cost_table.values[", at, "] is ", v, " (field ", std::countr_zero(m) + 1,
                         " of cost ", i, "): a cost must be finite and >= 0")));
      }
      c.*kCostFields[std::countr_zero(m)] = v;
      ++at;
    }
  }
  if (at != t.values_size()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("cost_table has ", t.values_size(), " values but its fields use ", at)));
  }
  return absl::OkStatus();
}

absl::Status DecodeCosts(const v1::CostTable& t, std::vector<devices::Cost>* out) {
  thread_local std::vector<devices::Cost> unique;
  thread_local std::vector<uint32_t> index;
  unique.clear();
  index.clear();
  if (absl::Status st = DecodeCostTable(t, &unique, &index); !st.ok()) return st;
  out->reserve(out->size() + index.size());
  for (uint32_t i : index) out->push_back(unique[i]);
  return absl::OkStatus();
}

void EncodeTensor(const devices::Tensor& t, v1::Tensor* o) {
  o->set_type(t.type == devices::ElementType::kFp16 ? v1::ELEMENT_TYPE_FP16
                                                    : v1::ELEMENT_TYPE_FP32);
  o->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
  o->set_data(t.bytes.data(), t.bytes.size());
}

absl::StatusOr<devices::Tensor> DecodeTensor(const v1::Tensor& o, int64_t max_bytes,
                                             const std::string& field) {
  devices::Tensor t;
  switch (o.type()) {
    case v1::ELEMENT_TYPE_FP16:
      t.type = devices::ElementType::kFp16;
      break;
    case v1::ELEMENT_TYPE_FP32:
      t.type = devices::ElementType::kFp32;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ".type = ", static_cast<int>(o.type()),
                                                     "; expected ELEMENT_TYPE_FP16 (1) or "
                                                     "ELEMENT_TYPE_FP32 (2)"));
  }
  const int64_t elem = devices::Tensor::ElementSize(t.type);
  // Size from the shape, saturating, so a huge shape is RESOURCE_EXHAUSTED
  // rather than an overflow. `extent` counts a 0 dimension as 1: an empty
  // tensor of shape [2^40, 0] is refused too, as kernels loop over its
  // other dimensions.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t bytes = elem, extent = elem;
  for (int i = 0; i < o.shape_size(); ++i) {
    const int64_t d = o.shape(i);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] = ", d, "; expected >= 0"));
    }
    bytes = d > 0 && bytes > kMax / d ? kMax : bytes * d;
    extent = d > 0 && extent > kMax / d ? kMax : extent * std::max<int64_t>(d, 1);
  }
  if (bytes > max_bytes || extent > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": ", extent,
                     " bytes by its shape (0 dimensions counted as 1); this agent "
                     "accepts tensors of at most ",
                     max_bytes, " bytes (servesim-agent --max-tensor-bytes)"));
  }
  if (static_cast<int64_t>(o.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".data has ", o.data().size(),
                                                   " bytes; its shape and type give ", bytes));
  }
  if (const int64_t i = devices::FirstNonFinite(
          t.type, reinterpret_cast<const uint8_t*>(o.data().data()), o.data().size());
      i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".data: element ", i, " is NaN or infinite; expected finite values"));
  }
  t.shape.assign(o.shape().begin(), o.shape().end());
  t.bytes.assign(o.data().begin(), o.data().end());
  return t;
}

void EncodeStats(const devices::KernelStats& s, v1::KernelStats* o) {
  o->set_kv_positions(s.kv_positions);
  o->set_kv_positions_read(s.kv_positions_read);
  o->set_v_rows_read(s.v_rows_read);
  o->set_bytes_read(s.bytes_read);
}

devices::KernelStats DecodeStats(const v1::KernelStats& o) {
  devices::KernelStats s;
  s.kv_positions = o.kv_positions();
  s.kv_positions_read = o.kv_positions_read();
  s.v_rows_read = o.v_rows_read();
  s.bytes_read = o.bytes_read();
  return s;
}

void EncodeDescription(const devices::DeviceDescription& d, v1::DescribeResponse* o) {
  o->set_kind(d.kind);
  o->set_preset(d.preset);
  for (const auto& [name, value] : d.parameters) {
    v1::Parameter* p = o->add_parameters();
    p->set_name(name);
    p->set_value(value);
  }
  for (OpKind k : d.accepts) o->add_accepts(EncodeOpKind(k));
  o->set_memory_bytes(d.memory_bytes);
  o->set_lookahead_ok(d.lookahead_ok);
  o->set_static_power_w(d.static_power_w);
  o->set_static_in_op_energy(d.static_in_op_energy);
  o->set_measures_steps(d.measures_steps);
  o->set_splits_layers(d.splits_layers);
  o->set_step_base_positions(d.step_base_positions);
  o->set_first_step_positions_per_token(d.first_step_positions_per_token);
}

absl::StatusOr<devices::DeviceDescription> DecodeDescription(const v1::DescribeResponse& o) {
  devices::DeviceDescription d;
  d.kind = o.kind();
  d.preset = o.preset();
  for (const v1::Parameter& p : o.parameters()) d.parameters.emplace_back(p.name(), p.value());
  for (int k : o.accepts()) {
    if (k < v1::OP_KIND_GEMM || k > v1::OP_KIND_MOE) {
      return absl::InvalidArgumentError(absl::StrCat("describe: accepts has unknown op kind ", k));
    }
    d.accepts.push_back(static_cast<OpKind>(k - 1));
  }
  d.memory_bytes = o.memory_bytes();
  d.lookahead_ok = o.lookahead_ok();
  if (!(o.static_power_w() >= 0 && o.static_power_w() <= 1e7)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "describe: static_power_w = ", o.static_power_w(), "; expected in [0, 1e7] W"));
  }
  d.static_power_w = o.static_power_w();
  d.static_in_op_energy = o.static_in_op_energy();
  d.measures_steps = o.measures_steps();
  d.splits_layers = o.splits_layers();
  for (const auto& [name, v] :
       {std::pair{"step_base_positions", o.step_base_positions()},
        std::pair{"first_step_positions_per_token", o.first_step_positions_per_token()}}) {
    if (!(v >= 0 && v <= 1e6)) {
      return absl::InvalidArgumentError(
          absl::StrCat("describe: ", name, " = ", v, "; expected in [0, 1e6] positions"));
    }
  }
  d.step_base_positions = o.step_base_positions();
  d.first_step_positions_per_token = o.first_step_positions_per_token();
  return d;
}

void EncodeStepKey(const devices::StepKey& k, v1::StepKey* o) {
  o->set_request_id(k.request_id);
  o->set_l(k.l);
}

void EncodeMeasurement(const devices::StepMeasurement& m, v1::StepMeasurement* o) {
  EncodeStepKey(m.step, o->mutable_step());
  o->mutable_values()->Add(m.values.begin(), m.values.end());
  if (m.parts > 1) {
    o->set_part(m.part);
    o->set_parts(m.parts);
  }
}

namespace {

absl::StatusOr<devices::StepKey> DecodeStepKey(const v1::StepKey& k, const std::string& where) {
  if (k.request_id() < 0 || k.l() < 1 || k.l() > kMaxContextTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is (request_id ", k.request_id(), ", l ", k.l(),
                     "); expected request_id >= 0 and l in [1, ", kMaxContextTokens, "]"));
  }
  return devices::StepKey{k.request_id(), k.l()};
}

absl::Status CheckCount(int n, int max, const std::string& field) {
  if (n > max) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, " has ", n, " entries; at most ", max, " per call"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<devices::StepKey>> DecodeStepKeys(
    const google::protobuf::RepeatedPtrField<v1::StepKey>& keys, int max,
    const std::string& field) {
  RETURN_IF_ERROR(CheckCount(keys.size(), max, field));
  std::vector<devices::StepKey> out;
  out.reserve(keys.size());
  for (int i = 0; i < keys.size(); ++i) {
    ASSIGN_OR_RETURN(devices::StepKey k, DecodeStepKey(keys[i], absl::StrCat(field, "[", i, "]")));
    out.push_back(k);
  }
  return out;
}

absl::StatusOr<std::vector<devices::StepMeasurement>> DecodeMeasurements(
    const google::protobuf::RepeatedPtrField<v1::StepMeasurement>& measured, int max,
    const std::string& field) {
  RETURN_IF_ERROR(CheckCount(measured.size(), max, field));
  std::vector<devices::StepMeasurement> out;
  out.reserve(measured.size());
  for (int i = 0; i < measured.size(); ++i) {
    const v1::StepMeasurement& m = measured[i];
    const std::string where = absl::StrCat(field, "[", i, "]");
    ASSIGN_OR_RETURN(devices::StepKey k, DecodeStepKey(m.step(), where + ".step"));
    if (m.values_size() > devices::kMaxStepValues) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has ", m.values_size(),
                                                     " values; at most ", devices::kMaxStepValues));
    }
    for (int j = 0; j < m.values_size(); ++j) {
      if (!std::isfinite(m.values(j))) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".values[", j, "] is not finite"));
      }
    }
    const int parts = std::max(1, m.parts());
    if (parts > devices::kMaxLayerParts || m.part() < 0 || m.part() >= parts) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is share ", m.part(), " of ", m.parts(), "; expected parts in [0, ",
                       devices::kMaxLayerParts, "] and part in [0, parts)"));
    }
    out.push_back({k, std::vector<double>(m.values().begin(), m.values().end()), m.part(), parts});
  }
  return out;
}

}  // namespace servesim::agents
