// CUDA graphs, as far as memory goes. Stream capture turns the
// stream-ordered allocator's calls into memory nodes of the capture's graph;
// an executable graph allocates and frees at each launch. The semantics
// follow cuda.h (cuGraphAddMemAllocNode, cuGraphInstantiateWithFlags,
// cuGraphLaunch) and the CUDA Programming Guide's "Graph memory nodes":
//  - an allocation node's virtual address is assigned when the node is made
//    (the address cuMemAllocAsync returns during capture) and stays fixed
//    for the node's lifetime, across instantiations and launches;
//  - memory is allocated when a launch reaches the node, and freed by a
//    free node of the graph (or of another graph), cuMemFreeAsync or
//    cuMemFree; destroying the graph frees no live allocation;
//  - a launch while allocations of the previous one are unfreed fails with
//    CUDA_ERROR_INVALID_VALUE, unless the executable was instantiated with
//    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH (then the launch frees
//    them first);
//  - a graph with memory nodes has at most one executable at a time.
// Nothing runs on a simulated stream: a launch makes its allocations and
// frees at once, in node (capture) order.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "device.h"
#include "internal_heap.h"

namespace memledger::simcuda {

struct State;
struct Block;

struct GraphNode {
  bool is_alloc = false;
  uintptr_t dptr = 0;
  size_t size = 0;  // alloc: bytes asked for
  size_t span = 0;  // alloc: address space and memory it takes, a multiple of the granularity
  Device* device = nullptr;
  bool freed_by_graph = false;  // alloc: a free node (of this or another graph) frees it
  bool live = false;            // alloc: allocated by a launch and not freed since
};

struct Graph {
  InternalVector<GraphNode> nodes;
  Context* context = nullptr;
  int execs = 0;           // executables instantiated from it and not destroyed
  bool destroyed = false;  // cuGraphDestroy'd; kept while an executable or a live allocation needs it
  bool has_memory_nodes() const { return !nodes.empty(); }
};

struct GraphExec {
  Graph* graph = nullptr;
  unsigned long long flags = 0;
};

// The caller holds the driver lock for all of these.
// cuMemAllocAsync / cuMemAllocFromPoolAsync on a capturing stream: an
// allocation node on `device`, its address in *out.
CUresult capture_alloc(State& st, Stream* stream, Device* device, size_t bytes, CUdeviceptr* out);
// cuMemFreeAsync on a capturing stream: a free node for a graph allocation.
CUresult capture_free(State& st, Stream* stream, uintptr_t addr);
// A graph allocation's memory given back (free node, cuMemFreeAsync, cuMemFree).
void free_graph_block(State& st, uintptr_t addr, const Block& block);
// Ends the stream's capture and discards its graph (the stream or its
// context is destroyed mid-capture).
void end_capture(State& st, Stream* stream);

}  // namespace memledger::simcuda
