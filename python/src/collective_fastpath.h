// What collective_fastpath.cpp's registries offer the rest of tpscope._native (funcol_fastpath.cpp): interned texts,
// the groups' sequence numbers, one collective's record and the program's own frame, in C++ terms. Every function
// holds the GIL (the registries have no lock of their own) and touches Python objects only where it says so.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace tpscope::python::fastpath {

// The id of TEXT for the life of the process (intern_text).
int internText(std::string_view text);
// The text interned as ID, or nullptr.
const std::string* textAt(int id);
// Records the enqueue (and start) of collective OP_ID in group GROUP_ID at TICKS (0: now) on PAYLOAD (a tensor, None or
// (dtype name, shape, bytes)); takes the group's next sequence number. False with a Python exception set on bad ids or
// a payload it cannot read. HANDLE is 0 when not recording.
bool issue(long long groupId, long long opId, long long callsiteId, long long layer, long long phase, PyObject* payload,
           uint64_t ticks, uint64_t& handle, uint64_t& seq);
// The innermost frame of the calling thread whose code is the program's own: its file's base name as a text id and
// its line, or -1 where every frame is torch's or tpscope's.
int programFrame(int& line);

}  // namespace tpscope::python::fastpath
