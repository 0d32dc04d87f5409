// Non-blocking operations: the same results as the blocking ones, several
// outstanding at once and completed in any order, and the life cycle of a
// Request (default, moved-from, destroyed before completion).
#include <catch2/catch.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// One operation of each kind, with forms whose completion has local work
// left (avg's division, the move of an in-place reduce_scatter block).
std::vector<Spec> one_of_each(std::size_t count, std::uint64_t salt) {
  const int last = world_size() - 1;
  return {
      Spec{.coll = Coll::allreduce,
           .dtype = DType::f32,
           .op = ReduceOp::avg,
           .count = count,
           .form = Form::in_place,
           .fill = Fill::random,
           .salt = salt},
      Spec{.coll = Coll::reduce_scatter,
           .dtype = DType::bf16,
           .op = ReduceOp::avg,
           .count = count,
           .form = Form::in_place,
           .fill = Fill::exact,
           .salt = salt},
      Spec{.coll = Coll::reduce_scatter,
           .dtype = DType::f64,
           .op = ReduceOp::max,
           .count = count,
           .form = Form::in_place_own_block,
           .salt = salt},
      Spec{.coll = Coll::reduce_scatter,
           .dtype = DType::i32,
           .op = ReduceOp::sum,
           .count = count,
           .form = Form::out_of_place,
           .salt = salt},
      Spec{.coll = Coll::allgather,
           .dtype = DType::i64,
           .count = count,
           .form = Form::in_place,
           .salt = salt},
      Spec{.coll = Coll::allgather,
           .dtype = DType::f16,
           .count = count,
           .form = Form::out_of_place,
           .salt = salt},
      Spec{.coll = Coll::broadcast,
           .dtype = DType::f64,
           .count = count,
           .form = Form::in_place,
           .root = last,
           .salt = salt},
  };
}

struct Started {
  std::vector<std::unique_ptr<Trial>> trials;
  std::vector<Request> requests;  // requests[i] completes trials[i]; the last one is a barrier
};

Started start_all(Communicator& c, const std::vector<Spec>& specs, bool& ok) {
  Started s;
  for (const Spec& spec : specs) s.trials.push_back(make_trial(spec, c.rank(), c.size()));
  ok = no_throw([&] {
    for (auto& t : s.trials) s.requests.push_back(t->start(c));
    s.requests.push_back(c.ibarrier());
  });
  return s;
}

// Checks every trial; one CHECK per trial, the same verdict on every rank.
void verify_all(const Communicator& c, const Started& s, bool started_ok) {
  CHECK(all_ranks_true(started_ok));
  for (const auto& t : s.trials) {
    const std::string error = t->verify();
    INFO(describe(t->spec()) << ", chunk " << c.max_chunk_elements());
    INFO(error);
    CHECK(all_ranks_true(error.empty()));
  }
}

}  // namespace

TEST_CASE("every non-blocking operation matches the reference", "[comm][nonblocking]") {
  Communicator chunked(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 7});
  for (Communicator* c : {&world(), &chunked}) {
    for (DType t : {DType::f32, DType::bf16, DType::i32}) {
      for (std::size_t count : {0, 7, 1000}) {
        std::vector<Spec> specs;
        for (Coll coll : {Coll::allreduce, Coll::reduce_scatter})
          for (ReduceOp op : ops_for(t))
            for (Form form : forms_for(coll))
              specs.push_back(Spec{.coll = coll,
                                   .dtype = t,
                                   .op = op,
                                   .count = count,
                                   .form = form,
                                   .fill = Fill::exact,
                                   .salt = 3});
        for (Form form : forms_for(Coll::allgather))
          specs.push_back(
              Spec{.coll = Coll::allgather, .dtype = t, .count = count, .form = form, .salt = 3});
        for (int root = 0; root < c->size(); ++root)
          specs.push_back(Spec{.coll = Coll::broadcast,
                               .dtype = t,
                               .count = count,
                               .form = Form::in_place,
                               .root = root,
                               .salt = 3});
        for (const Spec& spec : specs) {
          auto trial = make_trial(spec, c->rank(), c->size());
          const bool ran = no_throw([&] {
            Request r = trial->start(*c);
            r.wait();
            if (r.pending()) throw std::runtime_error("pending() after wait()");
          });
          const std::string error = ran ? trial->verify() : "the operation threw";
          INFO(describe(spec) << ", chunk " << c->max_chunk_elements());
          INFO(error);
          CHECK(all_ranks_true(error.empty()));
        }
      }
    }
  }
}

TEST_CASE("outstanding operations completed in reverse order", "[comm][nonblocking]") {
  Communicator chunked(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 7});
  for (Communicator* c : {&world(), &chunked}) {
    bool ok = false;
    Started s = start_all(*c, one_of_each(50, 4), ok);
    ok = ok && no_throw([&] {
           for (auto it = s.requests.rbegin(); it != s.requests.rend(); ++it) it->wait();
         });
    for (const Request& r : s.requests) ok = ok && !r.pending();
    verify_all(*c, s, ok);
  }
}

TEST_CASE("outstanding operations completed by polling test()", "[comm][nonblocking]") {
  Communicator chunked(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 7});
  for (Communicator* c : {&world(), &chunked}) {
    bool ok = false;
    Started s = start_all(*c, one_of_each(300, 5), ok);
    ok = ok && no_throw([&] {
           // Poll from the last issued to the first, until all are done; the
           // watchdog ends the job if one never completes.
           std::size_t left = s.requests.size();
           std::vector<bool> done(s.requests.size(), false);
           while (left > 0) {
             for (std::size_t i = s.requests.size(); i-- > 0;) {
               if (!done[i] && s.requests[i].test()) {
                 done[i] = true;
                 --left;
               }
             }
           }
         });
    // A completed Request stays complete.
    for (Request& r : s.requests) ok = ok && !r.pending() && r.test();
    verify_all(*c, s, ok);
  }
}

TEST_CASE("blocking operations may run while non-blocking ones are outstanding",
          "[comm][nonblocking]") {
  Communicator& c = world();
  bool ok = false;
  Started s = start_all(c, one_of_each(40, 6), ok);
  // Every rank issues the blocking ones after the same non-blocking ones.
  check_blocking(c, Spec{.coll = Coll::allreduce,
                         .dtype = DType::i64,
                         .op = ReduceOp::sum,
                         .count = 99,
                         .form = Form::in_place,
                         .salt = 6});
  ok = ok && no_throw([&] {
         for (Request& r : s.requests) r.wait();
       });
  verify_all(c, s, ok);
}

TEST_CASE("a Request destroyed before completion waits for its operation",
          "[comm][nonblocking][request]") {
  Communicator chunked(MPI_COMM_WORLD, CommOptions{.max_chunk_elements = 7});
  for (Communicator* c : {&world(), &chunked}) {
    bool ok = false;
    Started s = start_all(*c, one_of_each(64, 7), ok);
    ok = ok && no_throw([&] { s.requests.clear(); });  // destroyed, never waited
    verify_all(*c, s, ok);
  }
}

TEST_CASE("a default-constructed Request is complete", "[comm][nonblocking][request]") {
  Request r;
  CHECK_FALSE(r.pending());
  CHECK(no_throw([&] { r.wait(); }));
  CHECK(r.test());
  CHECK_FALSE(r.pending());
}

TEST_CASE("a moved-from Request is empty; the moved-to one completes the operation",
          "[comm][nonblocking][request]") {
  Communicator& c = world();
  auto first = make_trial(Spec{.coll = Coll::allreduce,
                               .dtype = DType::f64,
                               .op = ReduceOp::sum,
                               .count = 500,
                               .form = Form::out_of_place,
                               .salt = 8},
                          c.rank(), c.size());
  auto second = make_trial(Spec{.coll = Coll::reduce_scatter,
                                .dtype = DType::f16,
                                .op = ReduceOp::avg,
                                .count = 100,
                                .form = Form::in_place_own_block,
                                .fill = Fill::exact,
                                .salt = 8},
                           c.rank(), c.size());
  bool ok = no_throw([&] {
    // An operation may be complete when it starts (on one rank, a copy):
    // the move carries whatever it is.
    Request a = first->start(c);
    const bool a_pending = a.pending();
    Request b(std::move(a));  // move construction
    if (a.pending() || b.pending() != a_pending)
      throw std::runtime_error("move construction: wrong pending()");
    a.wait();  // no-op
    if (!a.test()) throw std::runtime_error("test() of a moved-from Request is false");

    Request d = second->start(c);
    const bool d_pending = d.pending();
    // Move assignment onto a pending Request first completes the one it held.
    b = std::move(d);
    if (d.pending() || b.pending() != d_pending)
      throw std::runtime_error("move assignment: wrong pending()");
    b.wait();
    if (b.pending()) throw std::runtime_error("pending() after wait()");
  });
  CHECK(all_ranks_true(ok));
  for (const Trial* t : {first.get(), second.get()}) {
    const std::string error = t->verify();
    INFO(describe(t->spec()));
    INFO(error);
    CHECK(all_ranks_true(error.empty()));
  }
}
