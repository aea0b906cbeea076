# The etcd backend of troupe_store: etcd_store over etcd's v3 JSON gateway. Included at
# the end of store/CMakeLists.txt. Boost.Beast is header-only and confined to
# etcd_http.cpp; nlohmann_json is header-only and needed only while building.
# TLS towards etcd is OpenSSL through Asio's ssl streams (libssl-dev).
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS SSL Crypto)
target_sources(troupe_store PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/etcd_http.cpp
  ${CMAKE_CURRENT_LIST_DIR}/etcd_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/etcd_store_url.cpp)
# The HTTP client (Beast's requests and parsers over plain and TLS streams) is the costliest
# source of the build: at -O2 it took 90 s on one core, at -O1 44 s. It waits on etcd over
# the network, not on the CPU, so the optimized builds compile it at -O1, on its own rather
# than in a batch with the store's other sources, which then need not parse Beast either.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/etcd_http.cpp PROPERTIES
  SKIP_UNITY_BUILD_INCLUSION ON
  COMPILE_OPTIONS "$<$<CONFIG:RelWithDebInfo,Release>:-O1>")
target_link_libraries(troupe_store
  PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json> OpenSSL::SSL OpenSSL::Crypto
  PUBLIC Threads::Threads)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/etcd_store.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/store)
