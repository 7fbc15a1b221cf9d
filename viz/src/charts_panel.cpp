// charts_panel.cpp — building the Qt Charts panels from metrics, pairing and (for
// serving traces) the KV cache.
#include "tdpipe/viz/charts_panel.hpp"

#include <QSet>
#include <QBoxLayout>
#include <QtCharts/QBarCategoryAxis>
#include <QtCharts/QBarSeries>
#include <QtCharts/QBarSet>
#include <QtCharts/QCategoryAxis>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QHorizontalStackedBarSeries>
#include <QtCharts/QLegend>
#include <QtCharts/QLegendMarker>
#include <QtCharts/QLineSeries>
#include <QtCharts/QScatterSeries>
#include <QtCharts/QStackedBarSeries>
#include <QtCharts/QValueAxis>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/viz/kv_cache_series.hpp"
#include "tdpipe/viz/op_style.hpp"

namespace tdpipe::viz {
namespace {

// At most this many scatter points: beyond it the plot is a blot and slow to draw.
constexpr int kMaxScatterPoints = 4000;

// KV chart decimation. A serving trace has a step per batch per rank (~20,000 per rank
// for 5,000 requests), far more than the chart's few hundred pixels show: each series
// keeps at most kMaxKvSeriesPoints points (decimate_kv_steps' M4 rule: per time bucket
// the first, lowest, highest and last change point, so the peak survives exactly), and
// all series together about kKvPointBudget (8 traces × 64 ranks stay drawable), but
// never fewer than kMinKvSeriesPoints each.
constexpr int kMaxKvSeriesPoints = 4000;
constexpr int kMinKvSeriesPoints = 400;
constexpr int kKvPointBudget = 60000;
// Beyond this many series the legend names each trace once, not each (trace, rank).
constexpr int kMaxKvLegendEntries = 8;

QChart* new_chart(const QString& title) {
  auto* chart = new QChart;
  QFont tf = chart->titleFont();
  tf.setPixelSize(12);
  tf.setBold(true);
  chart->setTitleFont(tf);
  chart->setTitle(title);
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->setMargins(QMargins(4, 2, 4, 2));
  chart->setBackgroundRoundness(0);
  QFont lf = chart->legend()->font();
  lf.setPixelSize(10);
  chart->legend()->setFont(lf);
  chart->legend()->setAlignment(Qt::AlignTop);
  return chart;
}

void style_axis(QAbstractAxis* axis, const QString& title = {}) {
  QFont f = axis->labelsFont();
  f.setPixelSize(10);
  axis->setLabelsFont(f);
  if (!title.isEmpty()) {
    f.setPixelSize(10);
    axis->setTitleFont(f);
    axis->setTitleText(title);
  }
}

// The x axis of per-rank bars (`per_rank` bars side by side for each of `ranks` ranks;
// bar i sits at x = i): a label per bar while they fit (`names`), past a dozen ranks (or
// two dozen bars) a rank label every few ranks ("r0", "r5", …) at its bars, which stays
// readable at 35–64 ranks where one label per bar would elide to "…". `bars` says what
// the bars of one rank are (the traces); the title says so where the labels do not, or
// where `explain_labels` (labels of tags that are not self-evident). `narrow`: the chart
// has half the panel's width (serving traces, see set_kv_data).
QAbstractAxis* rank_axis(const QStringList& names, int ranks, int per_rank, const QString& bars = {},
                         bool explain_labels = false, bool narrow = false) {
  // (a chart half the panel's width — beside another — has room for a third of the labels)
  if (ranks <= 12 && ranks * per_rank <= (narrow ? 8 : 24) && (!narrow || per_rank == 1)) {
    auto* x = new QBarCategoryAxis;
    x->append(names);
    style_axis(x, explain_labels ? QStringLiteral("bars: ") + bars : QString());
    return x;
  }
  auto* x = new QCategoryAxis;
  x->setLabelsPosition(QCategoryAxis::AxisLabelsPositionOnValue);
  x->setRange(-0.5, ranks * per_rank - 0.5);
  const int every = narrow ? (ranks <= 8 ? 1 : ranks <= 24 ? 4 : ranks <= 60 ? 10 : 20)
                           : ranks <= 24 ? 2 : ranks <= 60 ? 5 : 10;
  for (int r = 0; r < ranks; r += every) x->append(QStringLiteral("r%1").arg(r), r * per_rank + (per_rank - 1) / 2.0);
  x->setGridLineVisible(false);
  style_axis(x, per_rank > 1 ? QStringLiteral("rank (bars: %1)").arg(bars) : QStringLiteral("rank"));
  return x;
}

// A category axis keeps one category of each label (the bars of a second one fall on
// the first): labels of the traces, one each, made distinct where they are not —
// "[tag] label", else "[number] label".
QStringList distinct_labels(QStringList labels, const TraceNames& names) {
  auto distinct = [](const QStringList& l) { return QSet<QString>(l.begin(), l.end()).size() == l.size(); };
  if (distinct(labels)) return labels;
  QStringList tagged;
  for (int t = 0; t < labels.size(); ++t)
    tagged << QStringLiteral("[%1] %2").arg(t < names.size() ? QString::fromStdString(names.tag[static_cast<std::size_t>(t)])
                                                             : QString::number(t + 1),
                                            labels[t]);
  if (distinct(tagged)) return tagged;
  for (int t = 0; t < labels.size(); ++t) labels[t] = QStringLiteral("[%1] %2").arg(t + 1).arg(labels[t]);
  return labels;
}

void replace_chart(QChartView* view, QChart* chart) {
  QChart* old = view->chart();
  view->setChart(chart);
  delete old;  // setChart hands the old chart back to us
}

// A time unit that makes the largest value read between 1 and 1000.
std::pair<double, QString> unit_for(double max_ns) {
  if (max_ns >= 1e9) return {1e9, QStringLiteral("s")};
  if (max_ns >= 1e6) return {1e6, QStringLiteral("ms")};
  if (max_ns >= 1e3) return {1e3, QStringLiteral("µs")};
  return {1, QStringLiteral("ns")};
}

// Sets a value axis to [0, a round number ≥ max] with ticks at a 1-2-5 step.
void nice_range(QValueAxis* axis, double max) {
  if (max <= 0) max = 1;
  const double raw = max / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  const double top = std::ceil(max / step - 1e-9) * step;
  axis->setRange(0, top);
  axis->setTickCount(static_cast<int>(std::lround(top / step)) + 1);
}

QChartView* make_view(QWidget* parent) {
  auto* v = new QChartView(parent);
  v->setRenderHint(QPainter::Antialiasing, true);
  v->setMinimumHeight(110);
  v->setFrameShape(QFrame::NoFrame);
  return v;
}

}  // namespace

ChartsPanel::ChartsPanel(QWidget* parent) : QWidget(parent) {
  column_ = new QVBoxLayout(this);
  column_->setContentsMargins(0, 0, 0, 0);
  column_->setSpacing(2);
  top_row_ = new QHBoxLayout;
  top_row_->setSpacing(2);
  bubble_ = make_view(this);
  breakdown_ = make_view(this);
  scatter_ = make_view(this);
  iteration_ = make_view(this);
  kv_ = make_view(this);
  top_row_->addWidget(bubble_, 1);
  column_->addLayout(top_row_, 1);
  column_->addWidget(breakdown_, 1);
  column_->addWidget(scatter_, 1);
  column_->addWidget(iteration_, 1);
  // Serving's own chart, where it shows, gets the room of two: the KV cache over a run
  // is what tells serving plans apart (set_kv_data moves the breakdown beside the bubble
  // chart to make that room).
  column_->addWidget(kv_, 2);
  iteration_->setVisible(false);
  kv_->setVisible(false);
}

void ChartsPanel::set_data(const TimelineModel& model, const std::vector<traces::Metrics>& metrics) {
  const int n = static_cast<int>(metrics.size());
  const TraceNames& names = model.names();
  // Serving traces: the KV chart takes room, and the bubble and breakdown charts share a
  // row (set_kv_data), so these two keep their titles short and their axes sparse.
  bool serving = false;
  for (int t = 0; t < model.count(); ++t) serving = serving || has_serving_ops(model.trace(t));
  auto name_of = [&](int t) { return QString::fromStdString(names.name[static_cast<std::size_t>(t)]); };
  int nranks = 0;
  for (const auto& m : metrics) nranks = std::max(nranks, static_cast<int>(m.ranks.size()));
  QStringList rank_names;
  for (int r = 0; r < nranks; ++r) rank_names << QStringLiteral("r%1").arg(r);
  // Each trace's tag and lane label, distinct (categories of one label merge).
  QStringList tags, short_names;
  for (int t = 0; t < n; ++t) {
    tags << QString::fromStdString(names.tag[static_cast<std::size_t>(t)]);
    short_names << QString::fromStdString(names.short_name[static_cast<std::size_t>(t)]);
  }
  if (QSet<QString>(tags.begin(), tags.end()).size() != tags.size())
    for (int t = 0; t < n; ++t) tags[t] = QString::number(t + 1);
  short_names = distinct_labels(short_names, names);
  // What the bars of one rank are, where more than one: "predicted, measured", or each
  // trace's tag and name ("G gpipe, 1 1f1b, …") where the tags are not self-evident.
  QStringList bar_names;
  for (int t = 0; t < n; ++t)
    bar_names << (n <= 2 ? name_of(t) : QStringLiteral("%1 = %2").arg(tags[t], short_names[t]));
  QString bars = bar_names.join(QStringLiteral(", "));
  // (where the mapping would not fit an axis title, the header lines start with the tags)
  // (half as much room beside another chart where serving)
  if (n > 2 && bars.size() > (serving ? 30 : 90))
    bars = serving ? QStringLiteral("traces %1–%2 in order").arg(tags.front(), tags.back())
                   : QStringLiteral("traces %1–%2 in order, tagged as in the header").arg(tags.front(), tags.back());
  // A legend entry per trace: above the plot while the names fit a row, else beside it;
  // where serving (half the width), by the lane labels' short names once three or more.
  auto legend_name = [&](int t) { return serving && n > 2 ? short_names[t] : name_of(t); };
  int legend_chars = 0;
  for (int t = 0; t < n; ++t) legend_chars += static_cast<int>(legend_name(t).size()) + 5;
  const bool legend_beside = legend_chars > (serving ? 50 : 80);

  // 1. Bubble (idle) fraction per rank, a bar per trace.
  {
    QChart* chart = new_chart(serving ? QStringLiteral("Bubble per rank")
                                      : QStringLiteral("Bubble per rank: (iteration − compute) / iteration"));
    auto* series = new QBarSeries;
    for (int t = 0; t < n; ++t) {
      const auto& m = metrics[static_cast<std::size_t>(t)];
      auto* set = new QBarSet(legend_name(t));
      set->setColor(trace_color(t, n));
      set->setBorderColor(trace_color(t, n));
      for (int r = 0; r < nranks; ++r)
        *set << (r < static_cast<int>(m.ranks.size()) ? 100.0 * m.ranks[static_cast<std::size_t>(r)].idle_fraction : 0.0);
      series->append(set);
    }
    chart->addSeries(series);
    if (legend_beside) chart->legend()->setAlignment(Qt::AlignRight);
    QAbstractAxis* x = rank_axis(rank_names, nranks, 1, {}, false, serving);
    auto* y = new QValueAxis;
    double top = 0;
    for (const auto& m : metrics)
      for (const auto& r : m.ranks) top = std::max(top, 100.0 * r.idle_fraction);
    nice_range(y, std::min(100.0, top * 1.1));
    y->setLabelFormat(QStringLiteral("%.0f%%"));
    style_axis(y);
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    series->attachAxis(x);
    series->attachAxis(y);
    replace_chart(bubble_, chart);
  }

  // 2. Compute / exposed comm / idle per rank (and trace), stacked.
  {
    QChart* chart = new_chart(serving ? QStringLiteral("Compute and bubble per rank")
                                      : QStringLiteral("Compute and bubble per rank (bubble = exposed comm + idle)"));
    auto* series = new QStackedBarSeries;
    std::int64_t iter = 0;
    for (const auto& m : metrics) iter = std::max(iter, m.iteration_ns);
    const auto [scale, unit] = unit_for(static_cast<double>(iter));
    auto* compute = new QBarSet(QStringLiteral("compute"));
    auto* comm = new QBarSet(QStringLiteral("exposed comm"));
    auto* idle = new QBarSet(QStringLiteral("idle"));
    compute->setColor(QColor(0x4c, 0x78, 0xa8));
    comm->setColor(QColor(0xf2, 0x8e, 0x2b));
    idle->setColor(kBubbleColor);
    for (auto* s : {compute, comm, idle}) s->setBorderColor(s->color().darker(130));
    QStringList cats;
    for (int r = 0; r < nranks; ++r) {
      for (int t = 0; t < n; ++t) {
        const auto& m = metrics[static_cast<std::size_t>(t)];
        cats << QStringLiteral("r%1 %2").arg(r).arg(tags[t]);
        const traces::RankMetrics rm = r < static_cast<int>(m.ranks.size()) ? m.ranks[static_cast<std::size_t>(r)]
                                                                         : traces::RankMetrics{};
        *compute << static_cast<double>(rm.compute_ns) / scale;
        *comm << static_cast<double>(rm.exposed_comm_ns) / scale;
        *idle << static_cast<double>(rm.idle_ns) / scale;
      }
    }
    series->append(compute);
    series->append(comm);
    series->append(idle);
    series->setBarWidth(0.8);
    chart->addSeries(series);
    QAbstractAxis* x = rank_axis(cats, nranks, std::max(1, n), bars, n > 2, serving);
    auto* y = new QValueAxis;
    nice_range(y, static_cast<double>(iter) / scale);
    y->setLabelFormat(QStringLiteral("%.3g"));
    style_axis(y, unit);
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    series->attachAxis(x);
    series->attachAxis(y);
    replace_chart(breakdown_, chart);
  }

  // 3b. Three traces or more: each trace's iteration, mean compute + bubble, a row each.
  {
    iteration_->setVisible(n > 2);
    QChart* chart = new_chart(QStringLiteral("Iteration time per trace: mean compute per rank + bubble"));
    if (n > 2) {
      std::int64_t iter = 0;
      for (const auto& m : metrics) iter = std::max(iter, m.iteration_ns);
      const auto [scale, unit] = unit_for(static_cast<double>(iter));
      auto* series = new QHorizontalStackedBarSeries;
      auto* compute = new QBarSet(QStringLiteral("compute"));
      auto* bubble = new QBarSet(QStringLiteral("bubble"));
      compute->setColor(QColor(0x4c, 0x78, 0xa8));
      bubble->setColor(kBubbleColor);
      for (auto* s : {compute, bubble}) s->setBorderColor(s->color().darker(130));
      QStringList cats;
      for (int t = n - 1; t >= 0; --t) {  // the first trace on top, as in the timeline
        const auto& m = metrics[static_cast<std::size_t>(t)];
        const double it = static_cast<double>(m.iteration_ns);
        cats << short_names[t];
        *compute << it * (1 - m.bubble_fraction) / scale;
        *bubble << it * m.bubble_fraction / scale;
      }
      series->append(compute);
      series->append(bubble);
      series->setBarWidth(0.7);
      chart->addSeries(series);
      auto* y = new QBarCategoryAxis;
      y->append(cats);
      style_axis(y);
      auto* x = new QValueAxis;
      nice_range(x, static_cast<double>(iter) / scale);
      x->setLabelFormat(QStringLiteral("%.3g"));
      style_axis(x, unit);
      chart->addAxis(y, Qt::AlignLeft);
      chart->addAxis(x, Qt::AlignBottom);
      series->attachAxis(x);
      series->attachAxis(y);
    }
    replace_chart(iteration_, chart);
  }

  // 3. Two traces: the first vs the second's op durations, a series per op kind, with y = x.
  {
    const bool both = n == 2 && model.count() == 2;
    QChart* chart = new_chart(both ? QStringLiteral("Op duration: %1 vs %2").arg(name_of(1), name_of(0)) : QString());
    scatter_points_ = 0;
    selected_ = nullptr;
    // With one trace there is nothing to compare, and three or more have no one pair to
    // plot (each has its row in the iteration chart instead): the panel steps aside.
    scatter_->setVisible(both);
    if (both) {
      const auto& p = model.trace(0).events;
      const auto& m = model.trace(1).events;
      const auto& map = model.pairing().pred_to_meas;
      const int pairs = model.pairing().pairs;
      const int stride = std::max(1, (pairs + kMaxScatterPoints - 1) / kMaxScatterPoints);
      double max_ns = 1;
      for (std::size_t i = 0; i < p.size(); ++i)
        if (map[i] >= 0)
          max_ns = std::max({max_ns, double(p[i].dur_ns), double(m[static_cast<std::size_t>(map[i])].dur_ns)});
      const auto [scale, unit] = unit_for(max_ns);
      scatter_scale_ = scale;
      std::map<QString, QScatterSeries*> by_kind;
      int k = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (map[i] < 0 || (k++ % stride) != 0) continue;
        const auto& e = p[i];
        const QString name = e.kind ? QString::fromUtf8(ir::to_string(*e.kind).data(),
                                                        static_cast<qsizetype>(ir::to_string(*e.kind).size()))
                                    : QStringLiteral("other");
        auto*& s = by_kind[name];
        if (!s) {
          s = new QScatterSeries;
          s->setName(name);
          s->setMarkerSize(6);
          traces::TraceEvent kind_only;  // the kind's own colour, not a later chunk's shade
          kind_only.kind = e.kind;
          s->setColor(e.kind ? op_color(kind_only) : QColor(0x90, 0xa0, 0xb0));
          s->setBorderColor(s->color().darker(140));
        }
        s->append(double(e.dur_ns) / scale, double(m[static_cast<std::size_t>(map[i])].dur_ns) / scale);
        ++scatter_points_;
      }
      auto* x = new QValueAxis;
      auto* y = new QValueAxis;
      nice_range(x, max_ns / scale * 1.02);
      nice_range(y, max_ns / scale * 1.02);
      const double top = x->max();
      x->setLabelFormat(QStringLiteral("%.3g"));
      y->setLabelFormat(QStringLiteral("%.3g"));
      style_axis(x, QStringLiteral("%1 (%2)").arg(name_of(0), unit));
      style_axis(y, QStringLiteral("%1 (%2)").arg(name_of(1), unit));
      chart->addAxis(x, Qt::AlignBottom);
      chart->addAxis(y, Qt::AlignLeft);
      auto* diag = new QLineSeries;
      diag->setName(QStringLiteral("y = x"));
      diag->append(0, 0);
      diag->append(top, top);
      QPen pen(QColor(0x80, 0x80, 0x80));
      pen.setStyle(Qt::DashLine);
      pen.setWidthF(1.2);
      diag->setPen(pen);
      chart->addSeries(diag);
      diag->attachAxis(x);
      diag->attachAxis(y);
      for (auto& [name, s] : by_kind) {
        chart->addSeries(s);
        s->attachAxis(x);
        s->attachAxis(y);
      }
      // The op selected in the timeline (highlight_op): a ring on top, not in the legend.
      selected_ = new QScatterSeries;
      selected_->setName(QStringLiteral("selected"));
      selected_->setMarkerSize(16);
      selected_->setColor(Qt::transparent);
      selected_->setBorderColor(QColor(0xd6, 0x27, 0x28));
      QPen ring(QColor(0xd6, 0x27, 0x28));
      ring.setWidthF(2.5);
      selected_->setPen(ring);
      chart->addSeries(selected_);
      selected_->attachAxis(x);
      selected_->attachAxis(y);
      for (QLegendMarker* marker : chart->legend()->markers(selected_)) marker->setVisible(false);
    }
    replace_chart(scatter_, chart);
  }

  // 4. Serving traces: the KV cache held over time.
  set_kv_data(model);
}

void ChartsPanel::set_kv_data(const TimelineModel& model) {
  const int n = model.count();
  struct Curve {
    int trace;
    KvSeries series;
  };
  std::vector<Curve> curves;
  for (int t = 0; t < n; ++t)  // (a training trace has no series)
    for (auto& s : kv_cache_series(model.trace(t))) curves.push_back({t, std::move(s)});
  kv_points_ = 0;
  kv_->setVisible(!curves.empty());
  // Serving: the breakdown beside the bubble chart, in the top row; else below it.
  QLayout* breakdown_in = curves.empty() ? static_cast<QLayout*>(column_) : top_row_;
  if (breakdown_in->indexOf(breakdown_) < 0) {
    (curves.empty() ? top_row_ : column_)->removeWidget(breakdown_);
    if (curves.empty()) column_->insertWidget(1, breakdown_, 1);
    else top_row_->addWidget(breakdown_, 1);
  }
  if (curves.empty()) {
    replace_chart(kv_, new_chart(QString()));
    return;
  }
  QChart* chart = new_chart(QStringLiteral("KV cache held per rank (a step at each prefill / decode end)"));
  std::int64_t max_bytes = 0, max_end_ns = 0;
  for (const auto& c : curves) {
    for (const KvStep& s : c.series.steps) max_bytes = std::max(max_bytes, s.bytes);
    max_end_ns = std::max(max_end_ns, c.series.end_ns);
  }
  // y in the binary unit that makes the largest value read above 1.
  const double gib = 1024.0 * 1024 * 1024;
  const auto [y_scale, y_unit] = max_bytes >= gib        ? std::pair{gib, QStringLiteral("GiB")}
                                 : max_bytes >= 1 << 20 ? std::pair{1024.0 * 1024, QStringLiteral("MiB")}
                                                        : std::pair{1024.0, QStringLiteral("KiB")};
  const int per_series = std::clamp(kKvPointBudget / static_cast<int>(curves.size()), kMinKvSeriesPoints,
                                    kMaxKvSeriesPoints);
  // A step line draws two points per step (and one to the trace's end).
  const int max_steps = per_series / 2 - 1;
  std::map<int, int> ranks_of;  // trace → how many ranks have a series
  for (const auto& c : curves) ++ranks_of[c.trace];
  std::map<int, int> rank_index;  // trace → series made so far
  std::vector<QLineSeries*> made;
  for (const auto& c : curves) {
    const std::vector<KvStep> steps = decimate_kv_steps(c.series.steps, max_steps);
    QList<QPointF> points;
    points.reserve(static_cast<qsizetype>(2 * steps.size() + 1));
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const double x = static_cast<double>(steps[i].t_ns) / 1e9;
      if (i > 0) points.append(QPointF(x, static_cast<double>(steps[i - 1].bytes) / y_scale));
      points.append(QPointF(x, static_cast<double>(steps[i].bytes) / y_scale));
    }
    if (c.series.end_ns > steps.back().t_ns)
      points.append(QPointF(static_cast<double>(c.series.end_ns) / 1e9,
                            static_cast<double>(steps.back().bytes) / y_scale));
    auto* line = new QLineSeries;
    line->setName(QStringLiteral("%1 r%2").arg(QString::fromStdString(model.name(c.trace))).arg(c.series.rank));
    // The trace's colour on its last rank, earlier ranks lighter: the ranks of a pipeline
    // hold about the same KV a stage apart, so their lines overlap, and the one drawn
    // last (on top) is then the one in the trace's own colour.
    const int k = rank_index[c.trace]++;
    const int ranks = ranks_of[c.trace];
    const float lighten = ranks > 1 ? 0.5f * static_cast<float>(ranks - 1 - k) / static_cast<float>(ranks - 1) : 0.0f;
    const QColor base = trace_color(c.trace, n);
    const QColor color = QColor::fromRgbF(base.redF() + (1 - base.redF()) * lighten,
                                          base.greenF() + (1 - base.greenF()) * lighten,
                                          base.blueF() + (1 - base.blueF()) * lighten);
    QPen pen(color);
    pen.setWidthF(1.4);
    line->setPen(pen);
    line->replace(points);  // (one change signal, where append() sends one per point)
    kv_points_ += static_cast<int>(points.size());
    chart->addSeries(line);
    made.push_back(line);
  }
  auto* x = new QValueAxis;
  nice_range(x, static_cast<double>(max_end_ns) / 1e9);
  x->setLabelFormat(QStringLiteral("%.3g"));
  style_axis(x, QStringLiteral("time (s)"));
  auto* y = new QValueAxis;
  nice_range(y, static_cast<double>(max_bytes) / y_scale * 1.05);
  y->setLabelFormat(QStringLiteral("%.3g"));
  style_axis(y, QStringLiteral("KV cache (%1)").arg(y_unit));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  for (QLineSeries* line : made) {
    line->attachAxis(x);
    line->attachAxis(y);
  }
  // A legend entry per series while they fit a row or two; else one per trace
  // ("pp r0–r3"), at its last rank's line (the one in the trace's own colour), beside
  // the plot where even those are long.
  int series_chars = 0;
  for (QLineSeries* line : made) series_chars += static_cast<int>(line->name().size()) + 4;
  if (static_cast<int>(made.size()) > kMaxKvLegendEntries || series_chars > 110) {
    std::map<int, int> first_rank, last_rank;
    std::map<int, std::size_t> last_series;
    for (std::size_t i = 0; i < curves.size(); ++i) {
      const int t = curves[i].trace;
      if (!first_rank.count(t)) first_rank[t] = curves[i].series.rank;
      last_rank[t] = curves[i].series.rank;
      last_series[t] = i;
    }
    int trace_chars = 0;
    for (std::size_t i = 0; i < made.size(); ++i) {
      const int t = curves[i].trace;
      const bool shown = last_series[t] == i;
      const QString ranks = first_rank[t] == last_rank[t] ? QStringLiteral("r%1").arg(first_rank[t])
                                                          : QStringLiteral("r%1–r%2").arg(first_rank[t]).arg(last_rank[t]);
      const QString label = QStringLiteral("%1 %2").arg(QString::fromStdString(model.name(t)), ranks);
      if (shown) trace_chars += static_cast<int>(label.size()) + 4;
      for (QLegendMarker* marker : chart->legend()->markers(made[i])) {
        marker->setVisible(shown);
        if (shown) marker->setLabel(label);
      }
    }
    if (trace_chars > 90) chart->legend()->setAlignment(Qt::AlignRight);
  }
  replace_chart(kv_, chart);
}

void ChartsPanel::highlight_op(const TimelineModel& model, int trace, int index) {
  if (!selected_) return;
  selected_->clear();
  if (index < 0 || model.count() != 2 || (trace != 0 && trace != 1)) return;
  const auto twin = model.twin({trace, index}, 1 - trace);
  if (!twin) return;
  const int p = trace == 0 ? index : twin->index;
  const int m = trace == 0 ? twin->index : index;
  selected_->append(double(model.event({0, p}).dur_ns) / scatter_scale_,
                    double(model.event({1, m}).dur_ns) / scatter_scale_);
}

std::optional<QPointF> ChartsPanel::highlighted() const {
  if (!selected_ || selected_->count() == 0) return std::nullopt;
  return selected_->at(0);
}

}  // namespace tdpipe::viz
