// The host side of GPU tensors lent through CUDA IPC: the record's layout and its checks,
// the sender's book of loans, and the receiver's promise to release every loan it was
// handed, even when placing the tensor fails. No GPU needed.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <troupe/rpc/detail/ipc_record.hpp>
#include <troupe/rpc/detail/loan_book.hpp>
#include <troupe/rpc/device_helper.hpp>
#include <troupe/rpc/routing.hpp>

using namespace troupe;
using namespace troupe::rpc;
using namespace troupe::rpc::detail;

namespace {

ipc_record sample() {
  ipc_record r;
  r.pid = 4242;
  r.source_device = 1;
  r.loan_id = 77;
  r.offset = 4096;
  r.base = 0x7f0000000000;
  r.event = 0x1234;
  r.type = dtype::float32;
  r.shape = {3, 5, 7};
  for (int i = 0; i < 64; ++i) {
    r.mem_handle[static_cast<std::size_t>(i)] = std::byte(i);
    r.event_handle[static_cast<std::size_t>(i)] = std::byte(255 - i);
  }
  return r;
}

}  // namespace

TEST_CASE("an IPC record round-trips every field and is marked as a record for its target device") {
  auto t = encode_ipc_record(sample(), *device::cuda(2));
  REQUIRE(t);
  CHECK(is_ipc_record(*t));
  CHECK(t->dev() == *device::cuda(2));
  CHECK(t->nbytes() == ipc_record_size);
  auto r = decode_ipc_record(*t);
  REQUIRE(r);
  CHECK(r->pid == 4242);
  CHECK(r->source_device == 1);
  CHECK(r->loan_id == 77);
  CHECK(r->offset == 4096);
  CHECK(r->base == 0x7f0000000000);
  CHECK(r->event == 0x1234);
  CHECK(r->type == dtype::float32);
  CHECK(r->shape == std::vector<std::int64_t>{3, 5, 7});
  CHECK(r->nbytes() == 3 * 5 * 7 * 4);
  CHECK(r->mem_handle == sample().mem_handle);
  CHECK(r->event_handle == sample().event_handle);
  CHECK(ipc_record_loan_id(*t) == 77);
}

TEST_CASE("a malformed IPC record is refused with what is wrong") {
  auto good = encode_ipc_record(sample(), *device::cuda(0));
  REQUIRE(good);
  auto corrupt = [&](std::size_t at, std::uint8_t v) {
    auto t = tensor::zeros(dtype::uint8, {static_cast<std::int64_t>(ipc_record_size)});
    std::memcpy(t.data(), good->data(), ipc_record_size);
    static_cast<std::uint8_t*>(t.data())[at] = v;
    return decode_ipc_record(t);
  };
  auto wrong_size = decode_ipc_record(tensor::zeros(dtype::uint8, {10}));
  REQUIRE_FALSE(wrong_size);
  CHECK(wrong_size.error().code() == errc::protocol_error);
  CHECK(wrong_size.error().message().find("10 bytes") != std::string::npos);
  auto magic = corrupt(0, 0);
  REQUIRE_FALSE(magic);
  CHECK(magic.error().message().find("magic") != std::string::npos);
  auto version = corrupt(4, 9);
  REQUIRE_FALSE(version);
  CHECK(version.error().message().find("version 9") != std::string::npos);
  auto type = corrupt(48, 200);
  REQUIRE_FALSE(type);
  CHECK(type.error().message().find("dtype 200") != std::string::npos);
  auto rank = corrupt(49, 17);
  REQUIRE_FALSE(rank);
  CHECK(rank.error().message().find("rank 17") != std::string::npos);
  auto negative = corrupt(56 + 7, 0x80);  // the top byte of the first dimension
  REQUIRE_FALSE(negative);
  CHECK(negative.error().message().find("negative dimension") != std::string::npos);
  CHECK(ipc_record_loan_id(tensor::zeros(dtype::uint8, {10})) == 0);
}

TEST_CASE("the loan book keeps a loan until it is released, and only once") {
  loan_book book(std::chrono::seconds(30));
  auto kept = std::make_shared<int>(5);
  std::weak_ptr<int> watch = kept;
  const auto a = book.next_loan_id(), b = book.next_loan_id();
  CHECK(a != 0);
  CHECK(a != b);
  book.file_loan(a, std::move(kept));
  CHECK(book.size() == 1);
  CHECK_FALSE(watch.expired());
  CHECK(book.release(a));
  CHECK(watch.expired());
  CHECK_FALSE(book.release(a));
  CHECK_FALSE(book.release(b));
}

TEST_CASE("a loan nobody releases is dropped once older than the expiry") {
  loan_book book(std::chrono::milliseconds(50));
  auto kept = std::make_shared<int>(1);
  std::weak_ptr<int> watch = kept;
  book.file_loan(book.next_loan_id(), std::move(kept));
  CHECK(book.expire(clock::now()) == 0);
  CHECK(book.expire(clock::now() + std::chrono::milliseconds(100)) == 1);
  CHECK(watch.expired());
  CHECK(book.size() == 0);
}

TEST_CASE("a receiver releases every lent tensor it was handed, even when it cannot place them") {
  auto first = sample();
  first.loan_id = 11;
  auto second = sample();
  second.loan_id = 12;
  std::vector<tensor> ts{tensor::zeros(dtype::uint8, {4}),
                         *encode_ipc_record(first, *device::cuda(0)),
                         *encode_ipc_record(second, *device::cuda(3))};
  std::vector<std::uint64_t> released;
  // This worker has one device: cuda:3 is refused, cuda:0 cannot be opened here (no GPU,
  // or a handle from a process that does not exist).
  auto r = place_incoming(ts, "w1", 1, [&](std::uint64_t id) { released.push_back(id); });
  REQUIRE_FALSE(r);
  std::sort(released.begin(), released.end());
  CHECK(released == std::vector<std::uint64_t>{11, 12});
}

TEST_CASE("without a lender a CPU tensor is never lent and GPU routing is unchanged") {
  struct counting_lender final : ipc_lender {
    int filed = 0;
    std::uint64_t next_loan_id() override { return 1; }
    void file_loan(std::uint64_t, std::shared_ptr<void>) override { ++filed; }
  } lender;
  device_map m;
  REQUIRE(m.set(device::cpu(), *device::cuda(0)));
  std::vector<tensor> ts{tensor::zeros(dtype::float32, {8})};
  REQUIRE(prepare_outgoing(ts, "w0", "w1", &m, route_kind::request, &lender));
  CHECK(lender.filed == 0);
  CHECK_FALSE(is_ipc_record(ts[0]));
  CHECK(ts[0].dev() == *device::cuda(0));
}
