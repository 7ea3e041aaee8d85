// Which path a MoE block takes for a token, and the proof of what ran: the fused decode-MoE settings
// (MOECEL_FUSED_MOE, MOECEL_FUSED_MOE_MAX_DFF, --fused-moe) and the dispatch trace (MOECEL_TRACE=moe), which
// counts the MoE-layer dispatches made during decode steps. Prefill and teacher-forced runs are not decode
// steps and are never counted.
#pragma once
#include <cstdint>

namespace moecel {

struct FusedMoeSettings {
  bool enabled = true;   // MOECEL_FUSED_MOE (default on; 0/false/off/no turn it off), --fused-moe on|off
  int64_t max_dff = -1;  // MOECEL_FUSED_MOE_MAX_DFF; -1: the backend's default
};

// The settings in effect: read from the environment on first use (throws moecel::Error naming the variable for a
// value it cannot parse), then changed only by set_fused_moe_settings.
FusedMoeSettings fused_moe_settings();
void set_fused_moe_settings(const FusedMoeSettings& s);
// Parses an on/off word (1/true/on/yes, 0/false/off/no; case-insensitive); `what` names the source in errors.
bool parse_on_off(const char* value, const char* what);

namespace moe_trace {

struct Counts {
  int64_t decode_steps = 0, fused = 0, gather = 0;
};

// The totals so far (decode steps, and the dispatches made inside them).
Counts totals();
void reset();

// While alive, the MoE dispatches of the calling thread belong to one decode step (counted on construction).
class DecodeStep {
 public:
  DecodeStep();
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;
};

// While alive, dispatches are recorded into a graph instead of running: they are counted here, not in the
// totals; each replay of the graph then adds them once through replayed_step.
class Recording {
 public:
  Recording();
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  Counts counts() const;
};

// One decode step run by replaying a recorded graph that holds `per_step` dispatches.
void replayed_step(const Counts& per_step);

// Called by the MoE block for every dispatch; counted only inside a DecodeStep or a Recording.
void dispatch(bool fused);

// With MOECEL_TRACE naming "moe" (a comma-separated list; "all" too), prints at exit, on stderr, one line
// "moe dispatch: decode_steps=S fused=F gather=G"; an unknown category gets a one-line warning. Call once, early in
// main.
void install_from_env();

}  // namespace moe_trace
}  // namespace moecel
