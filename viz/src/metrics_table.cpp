// metrics_table.cpp — the comparison rows as a compact read-only table.
#include "tdpipe/viz/metrics_table.hpp"
#include "tdpipe/viz/side_names.hpp"

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
  setColumnCount(4);
  setHorizontalHeaderLabels({QStringLiteral("metric"), side_names().name[0], side_names().name[1],
                             side_names().difference});
  verticalHeader()->setVisible(false);
  verticalHeader()->setDefaultSectionSize(20);
  horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  for (int c = 1; c < 4; ++c) horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
  setEditTriggers(QAbstractItemView::NoEditTriggers);
  setSelectionBehavior(QAbstractItemView::SelectRows);
  setAlternatingRowColors(true);
  QFont f = font();
  f.setPixelSize(11);
  setFont(f);
}

void MetricsTable::set_rows(const std::vector<ComparisonRow>& rows) {
  setRowCount(static_cast<int>(rows.size()));
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const auto& row = rows[static_cast<std::size_t>(r)];
    const QString cells[4] = {QString::fromStdString(row.metric), cell(row.predicted, row.unit),
                              cell(row.measured, row.unit), cell(row.error, row.error_unit)};
    for (int c = 0; c < 4; ++c) {
      auto* item = new QTableWidgetItem(cells[c]);
      if (c > 0) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      setItem(r, c, item);
    }
  }
}

}  // namespace tdpipe::viz
