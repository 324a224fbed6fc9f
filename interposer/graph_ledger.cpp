#include "graph_ledger.h"

#include <sys/mman.h>

namespace memledger::interposer {
namespace {

GraphLedger g_graph_ledger;

}  // namespace

GraphLedger& graph_ledger() { return g_graph_ledger; }

bool GraphLedger::ensure_tables() {
  if (nodes_ != nullptr) return true;
  if (failed_) return false;
  void* mem = mmap(nullptr, kNodes * sizeof(Node), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (mem == MAP_FAILED) {
    failed_ = true;
    return false;
  }
  nodes_ = static_cast<Node*>(mem);
  return true;
}

bool GraphLedger::captured_alloc(uint64_t graph, format::Kind kind, int device, uint64_t addr, uint64_t size,
                                 uint32_t stack) {
  SpinGuard guard(lock_);
  if (!ensure_tables() || node_count_ == kNodes) return false;
  nodes_[node_count_++] = Node{graph, addr, size, stack, device, static_cast<uint8_t>(kind), 1, 0};
  return true;
}

bool GraphLedger::captured_free(uint64_t graph, uint64_t addr) {
  SpinGuard guard(lock_);
  if (!ensure_tables() || node_count_ == kNodes) return false;
  // The freed allocation's kind, from its node in any graph (a graph may
  // free another graph's allocation).
  uint8_t kind = static_cast<uint8_t>(format::Kind::kDevice);
  for (size_t i = node_count_; i-- > 0;) {
    Node& n = nodes_[i];
    if (n.is_alloc && n.addr == addr) {
      kind = n.kind;
      if (n.graph == graph) n.freed_in_graph = 1;
      break;
    }
  }
  nodes_[node_count_++] = Node{graph, addr, 0, 0, 0, kind, 0, 0};
  return true;
}

void GraphLedger::instantiated(uint64_t exec, uint64_t graph, bool auto_free) {
  SpinGuard guard(lock_);
  Exec* free_slot = nullptr;
  for (Exec& e : execs_) {
    if (e.exec == exec) {  // a handle reused without a destroy we saw
      e = Exec{exec, graph, auto_free};
      return;
    }
    if (e.exec == 0 && free_slot == nullptr) free_slot = &e;
  }
  if (free_slot != nullptr) *free_slot = Exec{exec, graph, auto_free};
}

bool GraphLedger::launch(uint64_t exec, void (*visit)(void*, const Node&, bool), void* context) {
  SpinGuard guard(lock_);
  const Exec* found = nullptr;
  for (const Exec& e : execs_) {
    if (e.exec == exec) {
      found = &e;
      break;
    }
  }
  if (found == nullptr || nodes_ == nullptr) return false;
  bool any = false;
  for (size_t i = 0; i < node_count_; ++i) {
    if (nodes_[i].graph != found->graph) continue;
    visit(context, nodes_[i], found->auto_free);
    any = true;
  }
  return any;
}

bool GraphLedger::graph_has_exec(uint64_t graph) const {
  for (const Exec& e : execs_) {
    if (e.exec != 0 && e.graph == graph) return true;
  }
  return false;
}

// Keeps the other graphs' nodes in capture order.
void GraphLedger::erase_nodes(uint64_t graph) {
  if (nodes_ == nullptr) return;
  size_t kept = 0;
  for (size_t i = 0; i < node_count_; ++i) {
    if (nodes_[i].graph != graph) nodes_[kept++] = nodes_[i];
  }
  node_count_ = kept;
}

void GraphLedger::exec_destroyed(uint64_t exec) {
  SpinGuard guard(lock_);
  for (Exec& e : execs_) {
    if (e.exec != exec) continue;
    const uint64_t graph = e.graph;
    e = Exec{};
    if (graph_has_exec(graph)) return;
    for (uint64_t& dead : dead_graphs_) {
      if (dead == graph) {
        dead = 0;
        erase_nodes(graph);
      }
    }
    return;
  }
}

void GraphLedger::graph_destroyed(uint64_t graph) {
  SpinGuard guard(lock_);
  if (!graph_has_exec(graph)) {
    erase_nodes(graph);
    return;
  }
  for (uint64_t& dead : dead_graphs_) {
    if (dead == 0 || dead == graph) {
      dead = graph;
      return;
    }
  }
  // No room to wait for its executables: drop the nodes now (their
  // launches are then not counted).
  erase_nodes(graph);
}

void GraphLedger::reset_after_fork() {
  lock_.reset();
  node_count_ = 0;
  for (Exec& e : execs_) e = Exec{};
  for (uint64_t& dead : dead_graphs_) dead = 0;
}

}  // namespace memledger::interposer
