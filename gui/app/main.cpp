// tpscope-gui [RUN]: the trace viewer. RUN is a run file (run.db), a rank file, or a capture folder.
#include <QApplication>
#include <QCommandLineParser>

#include "main_window.h"
#include "tpscope/version.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName("tpscope");
  QApplication::setApplicationName("tpscope-gui");
  QApplication::setApplicationVersion(QStringLiteral(TPSCOPE_VERSION));
  QCommandLineParser parser;
  parser.setApplicationDescription(
      "tpscope trace viewer\n\nEnvironment: TPSCOPE_GUI_FULL_LOAD_LIMIT=N — a run file of more than N spans (default "
      "40000000) is never read whole: the timeline shows its lane summary and reads the spans of the time on screen "
      "when zoomed in.");
  parser.addHelpOption();
  parser.addVersionOption();
  parser.addPositionalArgument("RUN", "run file, rank file or capture folder to open");
  QCommandLineOption follow({"f", "follow"}, "follow a capture in progress (reload as its files grow)");
  parser.addOption(follow);
  parser.process(app);

  tpscope::gui::MainWindow window;
  window.show();
  if (!parser.positionalArguments().isEmpty()) {
    window.openPath(parser.positionalArguments().front());
    if (parser.isSet(follow)) window.setFollowLive(true);
  }
  return app.exec();
}
