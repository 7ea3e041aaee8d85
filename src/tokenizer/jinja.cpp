// A Jinja2 template engine for chat templates (see jinja.h): parse once, render many times.
#include "tokenizer/jinja.h"

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_parser.h"

namespace moecel::jinja {

Template::Template(std::string_view source, const Options& opt)
    : nodes_(std::make_shared<const NodeList>(parse_template(source, opt))) {}

std::string Template::render(const Value& context) const {
  if (!context.is_dict() && !context.is_undefined() && !context.is_none())
    fail("template context must be a dict of variables, got {}", type_name(context));
  Interp interp;
  return interp.render(*nodes_, context);
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  return render(context.is_null() ? Value::none() : Value::from_json(context));
}

std::string Template::render(const nlohmann::json& context) const {
  return render(context.is_null() ? Value::none() : Value::from_json(context));
}

}  // namespace moecel::jinja
