# The API reference: `cmake --build <build dir> --target docs` runs Doxygen (Debian's
# `doxygen`) over the public headers and README.md and writes HTML to
# <build dir>/docs/api/html/index.html. docs/Doxyfile.in is the configuration.
find_program(TROUPE_DOXYGEN doxygen)
set(TROUPE_DOCS_OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/docs/api)
set(TROUPE_DOXYFILE ${CMAKE_CURRENT_BINARY_DIR}/docs/Doxyfile)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/docs/Doxyfile.in ${TROUPE_DOXYFILE} @ONLY)
if(TROUPE_DOXYGEN)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${TROUPE_DOCS_OUTPUT}
    COMMAND ${TROUPE_DOXYGEN} ${TROUPE_DOXYFILE}
    COMMAND ${CMAKE_COMMAND} -E echo "API reference: ${TROUPE_DOCS_OUTPUT}/html/index.html (warnings: ${TROUPE_DOCS_OUTPUT}/warnings.log)"
    COMMENT "Building the API reference with Doxygen"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "docs: doxygen was not found when CMake configured; install it (apt-get install doxygen, or scripts/install-deps.sh) and configure again"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
