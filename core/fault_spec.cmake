# The LibTorch-free parts of core/, built without LibTorch so that the CLI and the fuzz targets can use them:
# - tpscope_fault_spec: capture's fault injection and health rules (fault spec parser, health-rule options and the
#   rules themselves). Linked by tpscope_core (which runs them) and by the CLI's capture command (which validates
#   --inject/--health before any rank starts).
# - tpscope_config: TrainConfig, the training config parser (config.h). Linked by tpscope_core and by the
#   fuzz_config target (tests/hardening).
# Included from core/, cli/ and tests/; defined once.
if(NOT TARGET tpscope_fault_spec)
  add_library(tpscope_fault_spec STATIC
    ${CMAKE_CURRENT_LIST_DIR}/src/fault_spec.cpp
    ${CMAKE_CURRENT_LIST_DIR}/src/health_rules.cpp)
  add_library(tpscope::fault_spec ALIAS tpscope_fault_spec)
  target_include_directories(tpscope_fault_spec PUBLIC
    ${CMAKE_CURRENT_LIST_DIR}/include)
  target_link_libraries(tpscope_fault_spec
    PUBLIC tpscope::probes_api
    PRIVATE fmt::fmt nlohmann_json::nlohmann_json tpscope_warnings)
  set_target_properties(tpscope_fault_spec PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()
if(NOT TARGET tpscope_config)
  add_library(tpscope_config STATIC ${CMAKE_CURRENT_LIST_DIR}/src/config.cpp)
  add_library(tpscope::config ALIAS tpscope_config)
  target_include_directories(tpscope_config PUBLIC ${CMAKE_CURRENT_LIST_DIR}/include)
  target_link_libraries(tpscope_config PRIVATE fmt::fmt nlohmann_json::nlohmann_json tpscope_warnings)
  set_target_properties(tpscope_config PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()
