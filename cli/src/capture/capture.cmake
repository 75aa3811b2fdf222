# Link dependencies of `tpscope capture` (cli/src/cmd_capture.cpp + cli/src/capture/*.cpp, compiled into `tpscope`
# by cli/CMakeLists.txt, which includes this file). The recorder runtime is linked for its TcpKvServer (the ranks'
# clock-alignment store) only; tpscope_rules validates --inject/--health. Never LibTorch.
target_link_libraries(tpscope PRIVATE tpscope::probes_runtime tpscope::rules fmt::fmt)
# Commands outside capture/ that use its watcher (alerts --follow) test this.
target_compile_definitions(tpscope PRIVATE TPSCOPE_CLI_CAPTURE=1)
