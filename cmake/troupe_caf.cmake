# CAF 0.17 (Debian's libcaf-dev) ships no CMake config: import caf_core and caf_io by hand.
# Defines the imported targets troupe_caf_core and troupe_caf_io (global, so consumers of
# the package config can recreate them the same way).
if(NOT TARGET troupe_caf_core)
  find_path(TROUPE_CAF_INCLUDE_DIR caf/all.hpp)
  find_library(TROUPE_CAF_CORE_LIBRARY caf_core)
  find_library(TROUPE_CAF_IO_LIBRARY caf_io)
  if(NOT TROUPE_CAF_INCLUDE_DIR OR NOT TROUPE_CAF_CORE_LIBRARY OR NOT TROUPE_CAF_IO_LIBRARY)
    message(FATAL_ERROR "CAF 0.17 not found (caf/all.hpp, libcaf_core, libcaf_io). "
                        "Install it with: apt-get install libcaf-dev "
                        "(or run scripts/install-deps.sh).")
  endif()
  add_library(troupe_caf_core SHARED IMPORTED GLOBAL)
  set_target_properties(troupe_caf_core PROPERTIES
    IMPORTED_LOCATION ${TROUPE_CAF_CORE_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${TROUPE_CAF_INCLUDE_DIR}
    INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(troupe_caf_io SHARED IMPORTED GLOBAL)
  set_target_properties(troupe_caf_io PROPERTIES
    IMPORTED_LOCATION ${TROUPE_CAF_IO_LIBRARY}
    INTERFACE_LINK_LIBRARIES troupe_caf_core)
endif()

# CAF 0.17 spawns a function-based actor that takes no arguments with a null
# std::shared_ptr<std::tuple<>> and dereferences it (an empty tuple, never read): UBSan's
# null check reports that from CAF's header code, instantiated in the spawning target.
# Targets that spawn such actors turn that one check off when UBSan is on; the troupe
# libraries themselves keep it.
function(troupe_caf_spawn_workaround target)
  if("undefined" IN_LIST TROUPE_SANITIZE)
    target_compile_options(${target} PRIVATE -fno-sanitize=null)
  endif()
endfunction()
