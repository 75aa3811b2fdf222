# tpscope_fault_spec: the LibTorch-free half of capture's fault injection and health rules (fault spec parser,
# health-rule options and the rules themselves). Linked by tpscope_core (which runs them) and by the CLI's capture
# command (which validates --inject/--health before any rank starts). Included from core/ and cli/; defined once.
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
