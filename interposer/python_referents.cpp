// Two searches of the retention walk (tools/python/memledger/_retention.py),
// in one call per many objects:
// - for large buffers: each object's referents, by the collector's own
//   traversal (its type's tp_traverse, as gc.get_referents does), with a
//   visitor that compares type pointers and a length. In Python, the walk
//   looked at every referent of every tracked object, 1.6 million in a
//   small PyTorch program, for the few hundred of a type that may own a
//   buffer. A dict or a tuple that holds only objects the collector does
//   not track (NumPy arrays, bytes, numbers, strings) is not tracked either
//   (CPython leaves it out of the collector's lists): the visitor looks
//   inside such a referent too, so that a dict of arrays is searched;
// - for the instances that hold a few attribute dicts: where each object
//   keeps its dict, read, where the walk made a pass of gc.get_referrers.
//
// Called through ctypes.PyDLL: the caller holds the GIL for the whole call,
// and nothing here calls into the interpreter. The caller has checked the
// interpreter's object and type layout and passes the offsets it checked.

#include <algorithm>
#include <cstdint>
#include <cstring>

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// What _retention._ReferentScan passes, word for word.
struct Layout {
  uint64_t type;         // ob_type in an object
  uint64_t size;         // ob_size in a variable-size object (a tuple's, a bytes')
  uint64_t tuple_items;  // a tuple's first item
  uint64_t traverse;     // tp_traverse in a type object
  uint64_t mro;          // tp_mro in a type object
  uint64_t dict_type;    // the type objects dict and tuple
  uint64_t tuple_type;
  int64_t gc_next;       // the collector's link before an object: 0 while it is not tracked
};

// Untracked dicts and tuples inside one another, looked into at most.
constexpr int kMaxInside = 4;

using Visit = int (*)(void* object, void* arg);
using Traverse = int (*)(void* self, Visit visit, void* arg);

inline uintptr_t word_at(uintptr_t object, uint64_t offset) {
  uintptr_t value;
  std::memcpy(&value, reinterpret_cast<const void*>(object + offset), sizeof value);
  return value;
}

struct Scan {
  const Layout* layout;
  const uintptr_t* types;    // the types wanted
  const int64_t* min_sizes;  // each one's least ob_size, or -1: any object of it
  int32_t ntypes;
  uint64_t* out;
  int64_t capacity;  // pairs
  int64_t count;     // pairs written
  uintptr_t container;  // the object whose referents are visited
  int inside;           // untracked containers the visit is in
  // Each type met, and which wanted type it is or derives from (-1: none):
  // a few hundred types among millions of referents.
  static constexpr uint32_t kSlots = 1024;
  uintptr_t seen[kSlots];
  int32_t match[kSlots];
  uint32_t seen_count;

  // Which wanted type `type` is or derives from (its method resolution
  // order), or -1.
  int32_t resolve(uintptr_t type) const {
    for (int32_t i = 0; i < ntypes; ++i) {
      if (types[i] == type) return i;
    }
    const uintptr_t mro = word_at(type, layout->mro);
    if (mro == 0) return -1;
    const int64_t n = static_cast<int64_t>(word_at(mro, layout->size));
    for (int64_t k = 0; k < n; ++k) {
      const uintptr_t base = word_at(mro, layout->tuple_items + 8 * static_cast<uint64_t>(k));
      for (int32_t i = 0; i < ntypes; ++i) {
        if (types[i] == base) return i;
      }
    }
    return -1;
  }

  int32_t wanted(uintptr_t type) {
    uint32_t slot = static_cast<uint32_t>((type >> 4) * 0x9E3779B97F4A7C15ull >> 54) & (kSlots - 1);
    for (uint32_t probe = 0; probe < kSlots; ++probe, slot = (slot + 1) & (kSlots - 1)) {
      if (seen[slot] == type) return match[slot];
      if (seen[slot] == 0) {
        const int32_t m = resolve(type);
        if (seen_count < kSlots / 2) {  // kept at most half full
          seen[slot] = type;
          match[slot] = m;
          ++seen_count;
        }
        return m;
      }
    }
    return resolve(type);
  }
};

int visit(void* object, void* arg) {
  Scan& scan = *static_cast<Scan*>(arg);
  const uintptr_t child = reinterpret_cast<uintptr_t>(object);
  const uintptr_t type = word_at(child, scan.layout->type);
  if ((type == scan.layout->dict_type || type == scan.layout->tuple_type) && scan.inside < kMaxInside &&
      word_at(child - static_cast<uint64_t>(-scan.layout->gc_next), 0) == 0) {
    // Not tracked: no pass over the tracked objects reaches what it holds.
    const uintptr_t outer = scan.container;
    scan.container = child;
    ++scan.inside;
    const int stopped = reinterpret_cast<Traverse>(word_at(type, scan.layout->traverse))(object, visit, arg);
    --scan.inside;
    scan.container = outer;
    return stopped;
  }
  const int32_t m = scan.wanted(type);
  if (m < 0) return 0;
  if (scan.min_sizes[m] >= 0 && static_cast<int64_t>(word_at(child, scan.layout->size)) < scan.min_sizes[m]) {
    return 0;
  }
  if (scan.count == scan.capacity) return 1;  // stops the traversal
  scan.out[2 * scan.count] = scan.container;
  scan.out[2 * scan.count + 1] = child;
  ++scan.count;
  return 0;
}

}  // namespace

// Scans objects[begin, end) (object pointers, as a list's items) and writes
// (container, referent) pairs of object pointers into out (2 words each, at
// most `capacity` pairs) for each referent whose type is types[i] or
// derives from it and, where min_sizes[i] >= 0, whose ob_size is at least
// that. The container is the object scanned, or the untracked dict or tuple
// among its referents (or theirs) that holds the referent. Returns the pairs
// written and sets *next to the first object not scanned: `end`, or the
// object whose pairs did not fit (none of its pairs are written; where it
// is `begin`, the caller looks at that object another way).
MEMLEDGER_EXPORT int64_t memledger_py_referents(const uint64_t* layout, void* const* objects, int64_t begin,
                                                int64_t end, const uintptr_t* types, const int64_t* min_sizes,
                                                int32_t ntypes, uint64_t* out, int64_t capacity, int64_t* next) {
  static_assert(sizeof(Layout) == 8 * sizeof(uint64_t));
  Scan scan;
  scan.layout = reinterpret_cast<const Layout*>(layout);
  scan.types = types;
  scan.min_sizes = min_sizes;
  scan.ntypes = ntypes;
  scan.out = out;
  scan.capacity = capacity;
  scan.count = 0;
  scan.inside = 0;
  std::memset(scan.seen, 0, sizeof scan.seen);
  scan.seen_count = 0;
  int64_t i = begin;
  for (; i < end; ++i) {
    const uintptr_t object = reinterpret_cast<uintptr_t>(objects[i]);
    const auto traverse = reinterpret_cast<Traverse>(word_at(word_at(object, scan.layout->type), scan.layout->traverse));
    if (traverse == nullptr) continue;
    const int64_t before = scan.count;
    scan.container = object;
    if (traverse(objects[i], visit, &scan) != 0) {
      scan.count = before;
      break;
    }
  }
  *next = i;
  return scan.count;
}

namespace {

// What _retention._HolderScan passes, word for word.
struct DictLayout {
  uint64_t type;            // ob_type in an object
  uint64_t flags;           // tp_flags in a type object
  uint64_t dict_offset;     // tp_dictoffset in a type object
  uint64_t managed_flag;    // Py_TPFLAGS_MANAGED_DICT (3.11 on), or 0
  int64_t managed_offset;   // where such an object keeps its dict, from the object
  uint64_t values_tag;      // a low bit there that means inline values, not a dict (3.12), or 0
};

}  // namespace

// Scans objects[begin, end) for those whose own attribute dict (__dict__,
// where the object keeps it: a managed dict before the object, or at its
// type's tp_dictoffset) is one of dicts[0, ndicts) (sorted), and writes
// (index, dict) pairs into out, at most `capacity`. Reads two or three words
// an object: no traversal. Returns the pairs written; *next as for
// memledger_py_referents.
MEMLEDGER_EXPORT int64_t memledger_py_dict_holders(const uint64_t* layout, void* const* objects, int64_t begin,
                                                   int64_t end, const uintptr_t* dicts, int64_t ndicts,
                                                   uint64_t* out, int64_t capacity, int64_t* next) {
  static_assert(sizeof(DictLayout) == 6 * sizeof(uint64_t));
  DictLayout l;
  std::memcpy(&l, layout, sizeof l);
  int64_t count = 0;
  int64_t i = begin;
  for (; i < end; ++i) {
    const uintptr_t object = reinterpret_cast<uintptr_t>(objects[i]);
    const uintptr_t type = word_at(object, l.type);
    uintptr_t dict = 0;
    if (l.managed_flag != 0 && (word_at(type, l.flags) & l.managed_flag) != 0) {
      dict = word_at(object - static_cast<uint64_t>(-l.managed_offset), 0);
      if (l.values_tag != 0 && (dict & l.values_tag) != 0) dict = 0;
    } else {
      const auto offset = static_cast<int64_t>(word_at(type, l.dict_offset));
      if (offset > 0) dict = word_at(object, static_cast<uint64_t>(offset));
    }
    if (dict == 0 || !std::binary_search(dicts, dicts + ndicts, dict)) continue;
    if (count == capacity) break;
    out[2 * count] = static_cast<uint64_t>(i);
    out[2 * count + 1] = dict;
    ++count;
  }
  *next = i;
  return count;
}
