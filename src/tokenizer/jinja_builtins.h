// Built-ins of the Jinja engine: filters, tests, methods of str/dict/list, and the globals transformers
// gives chat templates (range, namespace, dict, raise_exception, strftime_now).
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace moecel::jinja {

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&);

FilterFn find_filter(std::string_view name);  // nullptr when there is no such filter
TestFn find_test(std::string_view name);
// jinja2 filters/tests this engine leaves out, so the error can say "not supported" instead of "unknown".
bool is_unsupported_filter(std::string_view name);
bool is_unsupported_test(std::string_view name);

// obj.name for built-in methods (str.startswith, dict.items, ...): true and the bound method in `out`.
// Throws for methods the sandbox forbids (list.append, dict.update, ...).
bool get_method(const Value& obj, std::string_view name, Value* out);

void add_globals(Dict& globals);

// Python's `fmt % args` (also the |format filter): %s %r %d %i %f %e %g %x %o %c %% with flags, width and
// precision; `args` is a tuple of values, a dict for %(name)s, or a single value.
std::string python_percent_format(const std::string& fmt, const Value& args);

// The attribute path of filters like map(attribute='a.b') / sort(attribute=...): item lookups per dotted
// part, integer parts index lists.
Value get_path(Interp& in, const Value& obj, const std::string& path);

// Binds call arguments to parameter names the way a Python signature does; unset parameters come back
// undefined. Throws "NAME() got an unexpected keyword argument 'x'" and the like.
std::vector<Value> bind_args(std::string_view fn, const CallArgs& a, std::initializer_list<const char*> params,
                             size_t n_required = 0);

}  // namespace moecel::jinja
