// Exported entry points: stream capture and CUDA graphs with memory nodes
// (graph.h), and the graph side of the stream-ordered allocator.

#include "driver_state.h"

using namespace memledger::simcuda;

namespace memledger::simcuda {
namespace {

// The allocation node at `addr`, in any graph that still exists.
GraphNode* find_allocation(State& st, uintptr_t addr, Graph** owner) {
  for (Graph* g : st.graphs) {
    for (GraphNode& n : g->nodes) {
      if (n.is_alloc && n.dptr == addr) {
        *owner = g;
        return &n;
      }
    }
  }
  return nullptr;
}

// A graph goes once it is destroyed, has no executable and no live
// allocation; its allocation nodes' addresses go with it.
void release_graph_if_unused(State& st, Graph* g) {
  if (!g->destroyed || g->execs > 0) return;
  for (const GraphNode& n : g->nodes) {
    if (n.is_alloc && n.live) return;
  }
  for (const GraphNode& n : g->nodes) {
    if (n.is_alloc) n.device->unmap_linear(n.dptr, n.span);
  }
  st.graphs.erase(g);
  internal_delete(g);
}

}  // namespace

CUresult capture_alloc(State& st, Stream* stream, Device* device, size_t bytes, CUdeviceptr* out) {
  const size_t span = round_up(bytes, kGranularity);
  // The address is the node's from now on; the memory comes at launch.
  std::optional<uintptr_t> addr = device->map_linear(span);
  if (!addr) return CUDA_ERROR_OUT_OF_MEMORY;
  discard_pages(*addr, span);
  GraphNode node;
  node.is_alloc = true;
  node.dptr = *addr;
  node.size = bytes;
  node.span = span;
  node.device = device;
  stream->capture->nodes.push_back(node);
  (void)st;
  *out = *addr;
  return CUDA_SUCCESS;
}

// Only a graph allocation can be freed by a graph, once (cuda.h,
// cuGraphAddMemFreeNode: an address not returned by an allocation node, or
// an allocation freed twice, is CUDA_ERROR_INVALID_VALUE).
CUresult capture_free(State& st, Stream* stream, uintptr_t addr) {
  Graph* owner = nullptr;
  GraphNode* alloc = find_allocation(st, addr, &owner);
  if (alloc == nullptr || alloc->freed_by_graph) return CUDA_ERROR_INVALID_VALUE;
  alloc->freed_by_graph = true;
  GraphNode node;
  node.dptr = addr;
  stream->capture->nodes.push_back(node);
  return CUDA_SUCCESS;
}

void free_graph_block(State& st, uintptr_t addr, const Block& block) {
  Device* device = block.device;
  device->unhold(block.held);
  device->graph_used -= block.size;
  device->graph_reserved -= block.held;
  discard_pages(addr, block.held);
  Graph* g = block.graph;
  for (GraphNode& n : g->nodes) {
    if (n.is_alloc && n.dptr == addr) n.live = false;
  }
  release_graph_if_unused(st, g);
}

void end_capture(State& st, Stream* stream) {
  Graph* g = stream->capture;
  if (g == nullptr) return;
  stream->capture = nullptr;
  g->destroyed = true;
  release_graph_if_unused(st, g);
}

}  // namespace memledger::simcuda

namespace {

Graph* live_graph(Call& call, CUgraph handle) {
  auto* g = reinterpret_cast<Graph*>(handle);
  return g != nullptr && call.st.graphs.count(g) != 0 && !g->destroyed ? g : nullptr;
}

// `into`: cuStreamBeginCaptureToGraph's graph (its nodes so far are kept,
// the captured ones follow them), else a new graph.
CUresult begin_capture(Call& call, CUstream handle, CUstreamCaptureMode mode, CUgraph into = nullptr) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(handle, &ctx)) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The default streams cannot be captured here (the legacy one never can).
  Stream* stream = call.stream_object(handle);
  if (stream == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (stream->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  Graph* g = nullptr;
  if (into != nullptr) {
    g = live_graph(call, into);
    if (g == nullptr || (g->context != nullptr && g->context != ctx)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    g = internal_new<Graph>();
    call.st.graphs.insert(g);
  }
  g->context = ctx;
  stream->capture = g;
  stream->capture_id = call.st.next_capture_id++;
  stream->capture_mode = mode;
  stream->capture_thread = pthread_self();
  return CUDA_SUCCESS;
}

// Dependencies order nodes; the simulated graphs keep capture order only.
CUresult begin_capture_to_graph(Call& call, CUstream handle, CUgraph graph, const CUgraphNode* dependencies,
                                size_t count, CUstreamCaptureMode mode) {
  if (count != 0 && dependencies == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return begin_capture(call, handle, mode, graph);
}

CUresult end_capture_call(Call& call, CUstream handle, CUgraph* graph) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(handle, &ctx)) return r;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = call.stream_object(handle);
  if (stream == nullptr || stream->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  // The capture goes on.
  if (stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(stream->capture_thread, pthread_self())) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  *graph = reinterpret_cast<CUgraph>(stream->capture);
  stream->capture = nullptr;
  return CUDA_SUCCESS;
}

CUresult capture_info(Call& call, CUstream handle, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** dependencies, const CUgraphEdgeData** edges, size_t* count) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(handle, &ctx)) return r;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = call.stream_object(handle);
  const bool active = stream != nullptr && stream->capture != nullptr;
  *status = active ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (!active) return CUDA_SUCCESS;
  if (id != nullptr) *id = stream->capture_id;
  if (graph != nullptr) *graph = reinterpret_cast<CUgraph>(stream->capture);
  // Memory nodes only: no dependency set is kept.
  if (dependencies != nullptr) *dependencies = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (count != nullptr) *count = 0;
  return CUDA_SUCCESS;
}

constexpr unsigned long long kInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

CUresult instantiate(Call& call, CUgraphExec* exec, CUgraph handle, unsigned long long flags) {
  if (CUresult r = call.initialized()) return r;
  Graph* g = live_graph(call, handle);
  if (exec == nullptr || g == nullptr || (flags & ~kInstantiateFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Memory nodes allow one executable at a time; device launch excludes them.
  if (g->has_memory_nodes() && (g->execs > 0 || (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* e = internal_new<GraphExec>();
  e->graph = g;
  e->flags = flags;
  ++g->execs;
  call.st.execs.insert(e);
  *exec = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

// Frees this launch's allocations after a failure part-way.
void undo_launch(State& st, Graph* g, size_t done) {
  for (size_t i = 0; i < done; ++i) {
    const GraphNode& n = g->nodes[i];
    if (n.is_alloc && n.live) free_block(st, n.dptr);
  }
}

CUresult launch(Call& call, CUgraphExec handle, CUstream stream) {
  Context* ctx = nullptr;
  if (CUresult r = call.stream_context(stream, &ctx)) return r;
  auto* e = reinterpret_cast<GraphExec*>(handle);
  if (e == nullptr || call.st.execs.count(e) == 0) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = call.stream_object(stream);
  if (s != nullptr && s->capture != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // no child graph nodes here
  Graph* g = e->graph;
  const bool auto_free = (e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
  for (const GraphNode& n : g->nodes) {
    if (n.is_alloc && n.live && !auto_free) return CUDA_ERROR_INVALID_VALUE;
  }
  for (const GraphNode& n : g->nodes) {
    if (n.is_alloc && n.live) free_block(call.st, n.dptr);
  }
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    GraphNode& n = g->nodes[i];
    if (!n.is_alloc) {
      // A free node whose allocation is not live (freed already, or of a
      // graph not launched) frees nothing: a program error the driver
      // does not report.
      free_block(call.st, n.dptr);
      continue;
    }
    if (!n.device->hold(n.span)) {
      undo_launch(call.st, g, i);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    make_accessible(n.dptr, n.span);
    n.live = true;
    Device& d = *n.device;
    d.graph_used += n.size;
    d.graph_reserved += n.span;
    if (d.graph_used > d.graph_used_high) d.graph_used_high = d.graph_used;
    if (d.graph_reserved > d.graph_reserved_high) d.graph_reserved_high = d.graph_reserved;
    call.st.blocks.emplace(n.dptr, Block{n.size, n.span, n.device, nullptr, nullptr, BlockKind::kGraph, false, g});
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuStreamBeginCapture(CUstream hStream) {
  Call call(Sym::cuStreamBeginCapture);
  return begin_capture(call, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  Call call(Sym::cuStreamBeginCapture_ptsz);
  return begin_capture(call, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  Call call(Sym::cuStreamBeginCapture_v2);
  return begin_capture(call, hStream, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  Call call(Sym::cuStreamBeginCapture_v2_ptsz);
  return begin_capture(call, hStream, mode);
}

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                     const CUgraphEdgeData*, size_t numDependencies, CUstreamCaptureMode mode) {
  Call call(Sym::cuStreamBeginCaptureToGraph);
  return begin_capture_to_graph(call, hStream, hGraph, dependencies, numDependencies, mode);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData*, size_t numDependencies, CUstreamCaptureMode mode) {
  Call call(Sym::cuStreamBeginCaptureToGraph_ptsz);
  return begin_capture_to_graph(call, hStream, hGraph, dependencies, numDependencies, mode);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  Call call(Sym::cuStreamEndCapture);
  return end_capture_call(call, hStream, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  Call call(Sym::cuStreamEndCapture_ptsz);
  return end_capture_call(call, hStream, phGraph);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  Call call(Sym::cuStreamIsCapturing);
  return capture_info(call, hStream, captureStatus, nullptr, nullptr, nullptr, nullptr, nullptr);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  Call call(Sym::cuStreamIsCapturing_ptsz);
  return capture_info(call, hStream, captureStatus, nullptr, nullptr, nullptr, nullptr, nullptr);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                   CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out) {
  Call call(Sym::cuStreamGetCaptureInfo_v2);
  return capture_info(call, hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                      numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  Call call(Sym::cuStreamGetCaptureInfo_v2_ptsz);
  return capture_info(call, hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                      numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                   CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                   const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  Call call(Sym::cuStreamGetCaptureInfo_v3);
  return capture_info(call, hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                      numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out) {
  Call call(Sym::cuStreamGetCaptureInfo_v3_ptsz);
  return capture_info(call, hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                      numDependencies_out);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  Call call(Sym::cuGraphInstantiateWithFlags);
  return instantiate(call, phGraphExec, hGraph, flags);
}

// CUDA 11.0 ABI: no flags, an error node and a log.
CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
                               size_t bufferSize) {
  Call call(Sym::cuGraphInstantiate_v2);
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return instantiate(call, phGraphExec, hGraph, 0);
}

namespace {

CUresult instantiate_with_params(Call& call, CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  params->hErrNode_out = nullptr;
  const CUresult r = instantiate(call, exec, graph, params->flags);
  params->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

}  // namespace

CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  Call call(Sym::cuGraphInstantiateWithParams);
  return instantiate_with_params(call, phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  Call call(Sym::cuGraphInstantiateWithParams_ptsz);
  return instantiate_with_params(call, phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  Call call(Sym::cuGraphLaunch);
  return launch(call, hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  Call call(Sym::cuGraphLaunch_ptsz);
  return launch(call, hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  Call call(Sym::cuGraphExecDestroy);
  if (CUresult r = call.initialized()) return r;
  auto* e = reinterpret_cast<GraphExec*>(hGraphExec);
  if (e == nullptr || call.st.execs.erase(e) == 0) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = e->graph;
  internal_delete(e);
  --g->execs;
  release_graph_if_unused(call.st, g);
  return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  Call call(Sym::cuGraphCreate);
  if (CUresult r = call.initialized()) return r;
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* g = internal_new<Graph>();
  call.st.graphs.insert(g);
  *phGraph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

// Live graph allocations outlive their graph: they are freed by
// cuMemFreeAsync or cuMemFree, or by another graph's free node.
CUresult cuGraphDestroy(CUgraph hGraph) {
  Call call(Sym::cuGraphDestroy);
  if (CUresult r = call.initialized()) return r;
  Graph* g = live_graph(call, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  g->destroyed = true;
  release_graph_if_unused(call.st, g);
  return CUDA_SUCCESS;
}
