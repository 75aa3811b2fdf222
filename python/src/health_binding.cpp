// The health half of tpscope._native (bindings.h): core's HealthRules — the same live rules, alerts and policies as
// tpscope-train's (docs/capture.md, "Live gradient-health rules") — fed with numbers the Python side computed on the
// device. `gradients()` writes the step's grad_stats rows and checks them from one list of rows, so the rows in the
// trace and the numbers the rules judged are the same.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "tpscope/probes/probes.h"
#include "tpscope/rules/health_rules.h"

namespace py = pybind11;
namespace probes = tpscope::probes;

namespace tpscope::python {

namespace {

rules::HealthOptions parseOptions(const std::string& text) {
  std::string error;
  auto options = rules::parseHealthOptions(text, &error);
  if (!options) throw py::value_error(error);  // "--health 'x=y': ..." (TPSCOPE_HEALTH is that text)
  return *options;
}

// One rank's rules. Actions are returned as ints (core::StepAction: 0 continue, 1 skip-step, 2 stop).
class Health {
 public:
  explicit Health(const std::string& optionsText) : rules_(parseOptions(optionsText)) {}

  // rows: one (l2_norm, max_abs, nan_count, inf_count, numel) per parameter, in model order, with `names` and
  // `layers` alongside. Writes them as this step's grad_stats rows and runs the gradient rules.
  int gradients(int step, const std::vector<std::string>& names, const std::vector<int>& layers,
                const std::vector<std::tuple<double, double, int64_t, int64_t, int64_t>>& rows) {
    if (names.size() != rows.size() || layers.size() != rows.size())
      throw py::value_error("gradients: names, layers and rows differ in length");
    std::vector<probes::GradStat> stats(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      probes::GradStat& s = stats[i];
      s.param = names[i];
      s.layer = layers[i];
      std::tie(s.l2Norm, s.maxAbs, s.nanCount, s.infCount, s.numel) = rows[i];
    }
    if (probes::Sink* sink = probes::sink()) sink->gradStats(step, stats);
    return static_cast<int>(rules_.checkGradients(step, stats));
  }

  int activation(int step, int layer, const std::string& where, int microBatch, uint64_t ticks, double value) {
    rules::ActivationFault f;
    f.layer = layer;
    f.where = where;
    f.microBatch = microBatch;
    f.ticks = ticks;
    f.value = value;
    return static_cast<int>(rules_.checkActivation(step, f));
  }

  int loss(int step, double localLoss) { return static_cast<int>(rules_.checkLoss(step, localLoss)); }

  int agree(int step, int agreed) {
    if (agreed < 0 || agreed > static_cast<int>(rules::StepAction::Stop))
      throw py::value_error("agree: action " + std::to_string(agreed) + " is not 0, 1 or 2");
    return static_cast<int>(rules_.agree(step, static_cast<rules::StepAction>(agreed)));
  }

  bool needsAgreement() const { return rules_.options().needsAgreement(); }
  std::string optionsText() const { return rules::formatHealthOptions(rules_.options()); }
  int alertsRaised() const { return rules_.alertsRaised(); }
  int stepsSkipped() const { return rules_.stepsSkipped(); }

 private:
  rules::HealthRules rules_;
};

}  // namespace

void bindHealth(py::module_& m) {
  using namespace py::literals;
  py::object kinds = m.attr("kinds");  // bindRecorder made it
  kinds.attr("ACTION_CONTINUE") = static_cast<int>(rules::StepAction::Continue);
  kinds.attr("ACTION_SKIP_STEP") = static_cast<int>(rules::StepAction::SkipStep);
  kinds.attr("ACTION_STOP") = static_cast<int>(rules::StepAction::Stop);
  py::class_<Health>(m, "Health",
                     "The live health rules of one rank (core/health_rules.h). Built from the options text of "
                     "TPSCOPE_HEALTH / `tpscope capture --health` (ValueError when it is malformed).")
      .def(py::init<const std::string&>(), "options"_a = "")
      .def("gradients", &Health::gradients, "step"_a, "names"_a, "layers"_a, "rows"_a)
      .def("activation", &Health::activation, "step"_a, "layer"_a, "where"_a, "micro_batch"_a, "ticks"_a, "value"_a)
      .def("loss", &Health::loss, "step"_a, "local_loss"_a)
      .def("agree", &Health::agree, "step"_a, "agreed"_a)
      .def_property_readonly("needs_agreement", &Health::needsAgreement)
      .def_property_readonly("options", &Health::optionsText)
      .def_property_readonly("alerts_raised", &Health::alertsRaised)
      .def_property_readonly("steps_skipped", &Health::stepsSkipped);
}

}  // namespace tpscope::python
