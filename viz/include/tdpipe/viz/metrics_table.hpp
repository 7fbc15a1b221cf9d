// metrics_table.hpp — a read-only table of comparison_rows(): the metric, one column per
// trace (headed by its name), and for two traces the difference column.
#pragma once

#include <QTableWidget>

#include "tdpipe/viz/comparison.hpp"

namespace tdpipe::viz {

class MetricsTable : public QTableWidget {
  Q_OBJECT

 public:
  explicit MetricsTable(QWidget* parent = nullptr);
  void set_rows(const std::vector<ComparisonRow>& rows, const TraceNames& names);
};

}  // namespace tdpipe::viz
