// Linked into the GPU suites: a test case that neither skipped itself (TROUPE_SKIP_TEST)
// nor ran an assertion fails the run, so that a GPU test cannot pass by doing nothing.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/skip.hpp"

namespace {

struct require_assertions : doctest::IReporter {
  explicit require_assertions(const doctest::ContextOptions&) {}

  void test_case_start(const doctest::TestCaseData& tc) override {
    name_ = tc.m_name;
    troupe_test::current_test_skipped() = false;
  }
  void test_case_end(const doctest::CurrentTestCaseStats& st) override {
    if (st.numAssertsCurrentTest == 0 && !troupe_test::current_test_skipped() && st.testCaseSuccess)
      empty_.push_back(name_);
  }
  void test_run_end(const doctest::TestRunStats&) override {
    if (empty_.empty()) return;
    for (const auto& n : empty_)
      std::printf(
          "[troupe-no-assertion] test case '%s' ran no assertion and did not skip: a "
          "GPU test must check something or say why it cannot\n",
          n.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  std::string name_;
  std::vector<std::string> empty_;
};

REGISTER_LISTENER("require_assertions", 1, require_assertions);

}  // namespace
