// What stream capture put into CUDA graphs, so that graph memory is counted
// when it exists: an allocation made by cu/cudaMallocAsync (or FromPool)
// while its stream is being captured is no allocation at that moment but an
// allocation node of the capture's graph, made real by each launch of an
// executable instantiated from that graph; a captured free is a free node,
// done by each launch (CUDA Programming Guide, "Graph memory nodes"; cuda.h,
// cuGraphAddMemAllocNode and cuGraphLaunch). The node's address is the one
// the capture returned, fixed for the node's lifetime.
//
// The hooks note captured nodes (with the capture site's stack), which
// executable came from which graph, and destructions; a launch replays its
// graph's nodes in capture order. Tables live in mmap'ed memory (never the
// hooked heap) behind one spin lock: captures and launches are rare next to
// allocations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spin_lock.h"
#include "trace_format.h"

namespace memledger::interposer {

class GraphLedger {
 public:
  struct Node {
    uint64_t graph;  // 0: empty
    uint64_t addr;
    uint64_t size;   // allocation: bytes asked for; free: 0
    uint32_t stack;  // allocation: the capture site
    int32_t device;
    uint8_t kind;    // format::Kind of the allocation (of the freed one for a free, when known)
    uint8_t is_alloc;
    uint8_t freed_in_graph;  // allocation: a free node of the same graph frees it
  };

  // An allocation or a free captured into `graph`. False when the table is
  // full (the node is then not counted at launches).
  bool captured_alloc(uint64_t graph, format::Kind kind, int device, uint64_t addr, uint64_t size, uint32_t stack);
  bool captured_free(uint64_t graph, uint64_t addr);
  // An executable made from `graph`; `auto_free`: instantiated with
  // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.
  void instantiated(uint64_t exec, uint64_t graph, bool auto_free);
  // Calls `visit` (under the ledger's lock) for each node of the graph
  // `exec` was made from, in capture order; false when `exec` is unknown
  // (instantiated through an entry point memledger does not hook) or its
  // graph has no memory nodes.
  bool launch(uint64_t exec, void (*visit)(void* context, const Node& node, bool auto_free), void* context);
  void exec_destroyed(uint64_t exec);
  // The graph is gone (cuGraphDestroy, or a capture that failed): its nodes
  // go once no executable made from it is left.
  void graph_destroyed(uint64_t graph);
  // A forked child owns none of its parent's graphs.
  void reset_after_fork();

 private:
  struct Exec {
    uint64_t exec;  // 0: empty
    uint64_t graph;
    bool auto_free;
  };
  static constexpr size_t kNodes = size_t{1} << 16;
  static constexpr size_t kExecs = 1024;
  static constexpr size_t kDeadGraphs = 1024;

  bool ensure_tables();
  bool graph_has_exec(uint64_t graph) const;
  void erase_nodes(uint64_t graph);

  SpinLock lock_;
  Node* nodes_ = nullptr;
  size_t node_count_ = 0;
  Exec execs_[kExecs] = {};
  // Graphs destroyed while an executable made from them still exists.
  uint64_t dead_graphs_[kDeadGraphs] = {};
  bool failed_ = false;
};

GraphLedger& graph_ledger();

}  // namespace memledger::interposer
