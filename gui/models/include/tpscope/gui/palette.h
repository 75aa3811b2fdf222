// The viewer's colours, in one place so models (BackgroundRole/ForegroundRole) and widgets agree and tests can check
// pixels against them.
#pragma once

#include <QColor>
#include <QString>

namespace tpscope::gui::palette {

// Span kinds (tracedb::SpanKind order).
QColor kind(int kind);
// Communication spans coloured by collective op when the name says which ("all_reduce", "ncclAllGather...", ...).
QColor collectiveOp(const QString& nameOrOp);
// The colour a span is drawn in: its op colour for comm / nccl_kernel spans, else its kind colour.
QColor span(int kind, const QString& name);
QColor severity(int severity);  // analysis::Severity order: critical, error, warning, info

// Heatmap: t in [0, 1] on a perceptual blue→yellow ramp; non-finite cells use kNonFinite.
QColor heat(double t);
inline const QColor kNonFinite{230, 0, 126};     // magenta: NaN / Inf cells
inline const QColor kNoData{60, 60, 60};         // cells with no record
inline const QColor kHighlight{255, 215, 0};     // selected collective, its (group, seq) on every rank, flows
inline const QColor kStuck{220, 30, 30};         // stuck collective / missing rank
inline const QColor kWaiting{245, 160, 30};      // entered the stuck collective, never completed
inline const QColor kOk{70, 170, 90};
inline const QColor kSelection{80, 160, 255, 70};  // range selection overlay
inline const QColor kBackground{30, 31, 36};
inline const QColor kLaneAlt{38, 40, 46};
inline const QColor kText{225, 225, 230};

}  // namespace tpscope::gui::palette
