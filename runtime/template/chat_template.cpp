#include "runtime/template/chat_template.h"

#include <fstream>
#include <sstream>

namespace tierlm::tmpl {

namespace {

void check_names(const std::string& source, const Expr& e);

void check_body(const std::string& source, const Body& body) {
  for (const auto& s : body) {
    if (s->expr) check_names(source, *s->expr);
    if (s->filter) check_names(source, *s->filter);
    for (const auto& [cond, b] : s->branches) {
      check_names(source, *cond);
      check_body(source, b);
    }
    for (const auto& p : s->params)
      if (p.default_value) check_names(source, *p.default_value);
    for (const auto& [t, e] : s->assignments) check_names(source, *e);
    check_body(source, s->body);
    check_body(source, s->else_body);
  }
}

// jinja2 rejects unknown filters and tests when compiling; so do we, at load.
void check_names(const std::string& source, const Expr& e) {
  auto fail = [&](const std::string& message) {
    auto [line, column] = line_column(source, e.offset);
    throw TemplateError(message, line, column);
  };
  if (e.kind == Expr::Kind::Filter && !has_filter(e.name)) fail("No filter named " + string_repr(e.name) + ".");
  if (e.kind == Expr::Kind::Test && !has_test(e.name)) fail("No test named " + string_repr(e.name) + ".");
  for (const auto& a : e.args)
    if (a) check_names(source, *a);
  for (const auto& [k, v] : e.kwargs) check_names(source, *v);
  for (const auto& [k, v] : e.dict_items) {
    check_names(source, *k);
    check_names(source, *v);
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TemplateError("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

boost::json::value read_json(const std::filesystem::path& path) {
  boost::system::error_code ec;
  auto v = boost::json::parse(read_file(path), ec);
  if (ec) throw TemplateError("invalid JSON in " + path.string() + ": " + ec.message());
  return v;
}

std::string token_content(const boost::json::value& v) {
  if (v.is_string()) return std::string(v.get_string());
  if (v.is_object()) {
    const auto* c = v.get_object().if_contains("content");
    if (c && c->is_string()) return std::string(c->get_string());
  }
  return {};
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, const TemplateLimits& limits) {
  ChatTemplate t;
  t.parsed_ = parse_template(std::move(source), limits.parse);
  t.limits_ = limits;
  check_body(t.parsed_->source, t.parsed_->body);
  return t;
}

std::string ChatTemplate::render(const boost::json::object& context) const {
  Dict vars;
  for (const auto& [k, v] : context) vars.set(std::string(k), from_json(v));
  Interpreter interpreter(*parsed_, limits_.render);
  return interpreter.render(vars);
}

std::string render_chat(const ChatTemplate& chat_template, const boost::json::array& messages,
                        bool add_generation_prompt, const boost::json::value& tools,
                        const boost::json::object& special_tokens, const boost::json::object& extra) {
  boost::json::object context = special_tokens;
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : extra) context[k] = v;
  return chat_template.render(context);
}

boost::json::object special_tokens_from_config(const boost::json::object& config) {
  boost::json::object out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    const auto* v = config.if_contains(key);
    if (!v || v->is_null()) continue;
    std::string content = token_content(*v);
    if (!content.empty() || v->is_string()) out[key] = content;
  }
  if (const auto* extra = config.if_contains("additional_special_tokens"); extra && extra->is_array()) {
    boost::json::array list;
    for (const auto& t : extra->get_array()) list.emplace_back(token_content(t));
    out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

const ChatTemplate& ModelChatTemplates::select(bool has_tools, std::string_view name) const {
  if (!name.empty()) {
    auto it = named.find(std::string(name));
    if (it == named.end()) throw TemplateError("the model has no chat template named '" + std::string(name) + "'");
    return it->second;
  }
  if (has_tools) {
    auto it = named.find("tool_use");
    if (it != named.end()) return it->second;
  }
  auto it = named.find("default");
  if (it != named.end()) return it->second;
  if (named.empty()) throw TemplateError("the model has no chat template");
  throw TemplateError("the model has several chat templates but none named 'default'");
}

ModelChatTemplates load_chat_templates(const std::filesystem::path& dir, const TemplateLimits& limits) {
  ModelChatTemplates out;
  boost::json::value config;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    config = read_json(dir / "tokenizer_config.json");
    if (config.is_object()) out.special_tokens = special_tokens_from_config(config.get_object());
  }
  auto add_templates = [&](const boost::json::value& field, const std::string& where) {
    try {
      if (field.is_string()) {
        out.named.emplace("default", ChatTemplate::parse(std::string(field.get_string()), limits));
      } else if (field.is_array()) {
        for (const auto& item : field.get_array()) {
          const auto* obj = item.if_object();
          const auto* n = obj ? obj->if_contains("name") : nullptr;
          const auto* t = obj ? obj->if_contains("template") : nullptr;
          if (!n || !t || !n->is_string() || !t->is_string())
            throw TemplateError("chat_template list entries need string 'name' and 'template'");
          out.named.emplace(std::string(n->get_string()), ChatTemplate::parse(std::string(t->get_string()), limits));
        }
      } else if (!field.is_null()) {
        throw TemplateError("chat_template must be a string or a list of {name, template}");
      }
    } catch (const TemplateError& e) {
      throw TemplateError(e.message() + " (in " + where + ")", e.line(), e.column());
    }
  };
  if (std::filesystem::exists(dir / "chat_template.jinja")) {
    add_templates(boost::json::value(read_file(dir / "chat_template.jinja")), (dir / "chat_template.jinja").string());
  } else if (std::filesystem::exists(dir / "chat_template.json")) {
    auto v = read_json(dir / "chat_template.json");
    if (v.is_object() && v.get_object().contains("chat_template"))
      add_templates(v.get_object().at("chat_template"), (dir / "chat_template.json").string());
  } else if (config.is_object() && config.get_object().contains("chat_template")) {
    add_templates(config.get_object().at("chat_template"), (dir / "tokenizer_config.json").string());
  }
  return out;
}

}  // namespace tierlm::tmpl
