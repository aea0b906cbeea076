# The etcd backend of troupe_store: etcd_store over etcd's v3 JSON gateway. Included at
# the end of store/CMakeLists.txt. Boost.Beast is header-only and confined to
# etcd_http.cpp; nlohmann_json is header-only and needed only while building.
# TLS towards etcd is OpenSSL through Asio's ssl streams (libssl-dev).
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS SSL Crypto)
target_sources(troupe_store PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/etcd_http.cpp
  ${CMAKE_CURRENT_LIST_DIR}/etcd_store.cpp)
target_link_libraries(troupe_store
  PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json> OpenSSL::SSL OpenSSL::Crypto
  PUBLIC Threads::Threads)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/etcd_store.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/store)
