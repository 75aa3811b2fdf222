#include "tpscope/gui/palette.h"

namespace tpscope::gui::palette {

static_assert(vocabulary::kSpanKindColourCount == tracedb::kSpanKindCount, "one colour per span kind");

QColor kind(int kind) {
  const bool known = kind >= 0 && kind < static_cast<int>(vocabulary::kSpanKindColourCount);
  return qcolor(vocabulary::kSpanKindColours[known ? static_cast<size_t>(kind) : vocabulary::kOtherSpanKind].fill);
}

QColor collectiveOp(const QString& nameOrOp) {
  const auto op = vocabulary::opMentionedIn(nameOrOp.toStdString());
  return op == vocabulary::CollectiveOp::Unknown ? QColor() : qcolor(vocabulary::kOpColours[static_cast<size_t>(op)].fill);
}

QColor span(int k, const QString& name) {
  const bool nccl = k == static_cast<int>(tracedb::SpanKind::NcclKernel);
  if (k == static_cast<int>(tracedb::SpanKind::Comm) || nccl) {
    const QColor op = collectiveOp(name);
    if (op.isValid()) return nccl ? op.darker(115) : op;
  }
  return kind(k);
}

QColor severity(int s) {
  const auto& table = vocabulary::kSeverityColours;
  return qcolor(table[s >= 0 && s < static_cast<int>(table.size()) ? static_cast<size_t>(s) : table.size() - 1].fill);
}

QColor textOn(const QColor& fill) {
  return qcolor(vocabulary::textOn({static_cast<uint8_t>(fill.red()), static_cast<uint8_t>(fill.green()),
                                    static_cast<uint8_t>(fill.blue())}));
}

QColor heat(double t) { return qcolor(vocabulary::heat(t)); }

}  // namespace tpscope::gui::palette
