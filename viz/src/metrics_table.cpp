// metrics_table.cpp — the comparison rows as a compact read-only table.
#include "tdpipe/viz/metrics_table.hpp"

#include <QHeaderView>
#include <cmath>

namespace tdpipe::viz {
namespace {

QString cell(const std::optional<double>& v, const std::string& unit) {
  if (!v) return QStringLiteral("–");
  const double a = std::abs(*v);
  // Percentages need fewer digits than times.
  const bool pct = unit == "%" || unit == "pp";
  const int decimals = a >= 100 ? 1 : (a >= 10 || pct ? 2 : 3);
  // A value far below its row's unit (the other side's is 1000× larger) keeps its digits.
  QString s = (a > 0 && a < 0.01 && !pct) ? QString::number(*v, 'g', 3)
                                          : QString::number(*v, 'f', (unit.empty() && *v == std::round(*v)) ? 0 : decimals);
  if (*v > 0 && unit == "pp") s.prepend(QLatin1Char('+'));
  if (!unit.empty()) s += (unit == "%" ? QString() : QStringLiteral(" ")) + QString::fromStdString(unit);
  return s;
}

}  // namespace

MetricsTable::MetricsTable(QWidget* parent) : QTableWidget(parent) {
  set_rows({}, default_trace_names({}));
  verticalHeader()->setVisible(false);
  verticalHeader()->setDefaultSectionSize(20);
  setEditTriggers(QAbstractItemView::NoEditTriggers);
  setSelectionBehavior(QAbstractItemView::SelectRows);
  setAlternatingRowColors(true);
  QFont f = font();
  f.setPixelSize(11);
  setFont(f);
}

void MetricsTable::set_rows(const std::vector<ComparisonRow>& rows, const TraceNames& names) {
  // metric | one column per trace | the difference, for two traces
  const int n = names.size();
  const bool difference = n == 2 && !names.difference.empty();
  const int columns = 1 + n + (difference ? 1 : 0);
  // Past two traces the columns carry the short names (the full ones in their tooltips),
  // so that eight of them leave the metric names room to be read.
  QStringList headers{QStringLiteral("metric")};
  for (int t = 0; t < n; ++t)
    headers << QString::fromStdString(n > 2 && t < static_cast<int>(names.short_name.size())
                                          ? names.short_name[static_cast<std::size_t>(t)]
                                          : names.name[static_cast<std::size_t>(t)]);
  if (difference) headers << QString::fromStdString(names.difference);
  setColumnCount(static_cast<int>(headers.size()));
  setHorizontalHeaderLabels(headers);
  for (int t = 0; t < n; ++t)
    if (QTableWidgetItem* h = horizontalHeaderItem(1 + t))
      h->setToolTip(QString::fromStdString(names.name[static_cast<std::size_t>(t)]));
  horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  horizontalHeader()->setMinimumSectionSize(40);
  for (int c = 1; c < columnCount(); ++c) horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
  setRowCount(static_cast<int>(rows.size()));
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const auto& row = rows[static_cast<std::size_t>(r)];
    QStringList cells{QString::fromStdString(row.metric)};
    for (int t = 0; t < n; ++t)
      cells << cell(t < static_cast<int>(row.values.size()) ? row.values[static_cast<std::size_t>(t)] : std::nullopt,
                    row.unit);
    if (difference) cells << cell(row.error, row.error_unit);
    for (int c = 0; c < columns; ++c) {
      auto* item = new QTableWidgetItem(cells[c]);
      if (c > 0) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      setItem(r, c, item);
    }
  }
}

}  // namespace tdpipe::viz
