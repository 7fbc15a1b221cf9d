// side_names.hpp — what the viewer calls its two traces: "predicted" and "measured" by
// default, or two names of the user's (`tdpipe-view --labels before,after`: two
// measured runs, a balanced and an unbalanced one) — in lane labels, legends, charts,
// the metrics table and tooltips alike.
#pragma once

#include <QString>

#include "tdpipe/viz/timeline_model.hpp"

namespace tdpipe::viz {

struct SideNames {
  QString name[2] = {QStringLiteral("predicted"), QStringLiteral("measured")};
  QString short_name[2] = {QStringLiteral("pred"), QStringLiteral("meas")};
  QString tag[2] = {QStringLiteral("P"), QStringLiteral("M")};  ///< chart categories
  QString difference = QStringLiteral("error");  ///< (first − second) / second
};

const SideNames& side_names();
inline const QString& side_name(Side s) { return side_names().name[static_cast<int>(s)]; }

/// Names both sides (non-empty, distinct); the difference column becomes "change".
void set_side_names(const QString& first, const QString& second);
/// Back to predicted / measured.
void reset_side_names();

}  // namespace tdpipe::viz
