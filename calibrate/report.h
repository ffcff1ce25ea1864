// calibrate/report.h — a wisdom entry rendered for a person: the machine, the model, each decision with its reason
// and measurements, the predicted speed, and memory by ledger account as bars against the budget.
// Never: used for machines (they get calibrate::to_json).
#pragma once

#include <string>

#include "calibrate/wisdom.h"

namespace tierlm::calibrate {

std::string render_entry(const WisdomEntry& entry);

}  // namespace tierlm::calibrate
