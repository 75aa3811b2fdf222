// The viewer's colours, in one place so models (BackgroundRole/ForegroundRole) and widgets agree and tests can check
// pixels against them. Span kinds, collective ops, severities, the heatmap ramp and the marks are rendered from the
// colour table the HTML report draws from too (tpscope/vocabulary/colours.h); the rest is the viewer's dark theme.
#pragma once

#include <QColor>
#include <QString>

#include "tpscope/tracedb/records.h"
#include "tpscope/vocabulary/colours.h"

namespace tpscope::gui::palette {

inline QColor qcolor(vocabulary::Rgb c) { return QColor(c.r, c.g, c.b); }

// Span kinds (tracedb::SpanKind order); an unknown kind gets the colour of `other`.
QColor kind(int kind);
inline QColor kind(tracedb::SpanKind k) { return palette::kind(static_cast<int>(k)); }
// Communication spans coloured by collective op when the name says which ("all_reduce", "ncclAllGather...", ...).
QColor collectiveOp(const QString& nameOrOp);
// The colour a span is drawn in: its op colour for comm / nccl_kernel spans, else its kind colour.
QColor span(int kind, const QString& name);
QColor severity(int severity);  // analysis::Severity order: critical, error, warning, info
// The text colour that reads on `fill`: light on dark fills, dark on light ones (vocabulary::textOn).
QColor textOn(const QColor& fill);

// Heatmap: t in [0, 1] on a perceptual blue→yellow ramp; non-finite cells use kNonFinite.
QColor heat(double t);
inline const QColor kNonFinite = qcolor(vocabulary::kNonFinite);  // magenta: NaN / Inf cells
inline const QColor kNoData{60, 60, 60};         // cells with no record
inline const QColor kHighlight{255, 215, 0};     // selected collective, its (group, seq) on every rank, flows
inline const QColor kStuck = qcolor(vocabulary::kStuck);      // stuck collective / missing rank
inline const QColor kWaiting = qcolor(vocabulary::kWaiting);  // entered the stuck collective, never completed
inline const QColor kOk{70, 170, 90};
inline const QColor kSelection{80, 160, 255, 70};  // range selection overlay
inline const QColor kCriticalPath{245, 245, 250};  // the what-if critical path's outline (the page's: its text colour)
inline const QColor kBackground{30, 31, 36};
inline const QColor kLaneAlt{38, 40, 46};
inline const QColor kText{225, 225, 230};

}  // namespace tpscope::gui::palette
