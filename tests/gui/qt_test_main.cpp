// GoogleTest main with a Qt application object (signals, timers, fonts). QT_QPA_PLATFORM=offscreen comes from the
// test's ENVIRONMENT property; set here too so a direct run of the binary works headless.
#include <gtest/gtest.h>

#include <cstdlib>

#ifdef TPSCOPE_GUI_TEST_WIDGETS
#include <QApplication>
using TestApplication = QApplication;
#else
#include <QGuiApplication>
using TestApplication = QGuiApplication;
#endif

int main(int argc, char** argv) {
  ::setenv("QT_QPA_PLATFORM", "offscreen", 0);
  TestApplication app(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
