// main.cpp — the GUI tests' entry point: a QApplication must exist before any widget,
// so this main creates one (offscreen unless a platform is chosen) and then runs Catch.
#define CATCH_CONFIG_RUNNER
#include <QApplication>
#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  // Test discovery runs this binary at build time, outside ctest's environment.
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  int qt_argc = 1;
  QApplication app(qt_argc, argv);
  return Catch::Session().run(argc, argv);
}
