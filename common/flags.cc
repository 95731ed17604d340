#include "common/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/error.h"

namespace tessera {
namespace {

// "in [1, 4096]", or "at least 0" when the top is the type's.
std::string int_range(int64_t lo, int64_t hi, int64_t type_max) {
  if (hi >= type_max) return detail::concat("at least ", lo);
  return detail::concat("in [", lo, ", ", hi, "]");
}

}  // namespace

std::optional<int64_t> parse_int(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || *end || end == text.c_str()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parse_real(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || *end || end == text.c_str() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

namespace {
int64_t checked_int(const std::string& value, const std::string& source, int64_t lo, int64_t hi, int64_t type_max) {
  const auto v = parse_int(value);
  if (!v)
    throw ConfigError(source, detail::concat("'", value, "' is not a whole number ", int_range(lo, hi, type_max)));
  if (*v < lo || *v > hi)
    throw ConfigError(source, detail::concat("'", value, "' is not ", int_range(lo, hi, type_max)));
  return *v;
}
}  // namespace

int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const auto v = env_value(name);
  return v ? checked_int(*v, name, lo, hi, std::numeric_limits<int64_t>::max()) : def;
}

Flags::Flags(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

Flags& Flags::add(Spec spec) {
  TESSERA_CHECK(!find(spec.name), "flag ", spec.name, " declared twice");
  specs_.push_back(std::move(spec));
  return *this;
}

const Flags::Spec* Flags::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

Flags& Flags::text(const std::string& name, std::string* out, const char* env) {
  return add({name, env, true, false, [out](const std::string& v, const std::string&) { *out = v; }});
}

Flags& Flags::integer(const std::string& name, int64_t* out, int64_t lo, int64_t hi, const char* env) {
  return add({name, env, true, false, [out, lo, hi](const std::string& v, const std::string& source) {
                *out = checked_int(v, source, lo, hi, std::numeric_limits<int64_t>::max());
              }});
}

Flags& Flags::integer(const std::string& name, int* out, int lo, int hi, const char* env) {
  return add({name, env, true, false, [out, lo, hi](const std::string& v, const std::string& source) {
                *out = static_cast<int>(checked_int(v, source, lo, hi, std::numeric_limits<int>::max()));
              }});
}

Flags& Flags::real(const std::string& name, double* out, Interval range) {
  return add({name, nullptr, true, false, [out, range](const std::string& v, const std::string& source) {
                const auto x = parse_real(v);
                if (!x) throw ConfigError(source, detail::concat("'", v, "' is not a finite number in ", range.str()));
                if (!range.contains(*x)) throw ConfigError(source, detail::concat("'", v, "' is not in ", range.str()));
                *out = *x;
              }});
}

Flags& Flags::toggle(const std::string& name, bool* out) {
  return add({name, nullptr, false, false, [out](const std::string&, const std::string&) { *out = true; }});
}

Flags& Flags::optional_text(const std::string& name, std::string* out, const std::string& bare) {
  return add({name, nullptr, false, true,
              [out, bare](const std::string& v, const std::string&) { *out = v.empty() ? bare : v; }});
}

Flags& Flags::positional(std::vector<std::string>* out, size_t min, size_t max, std::string what) {
  positional_ = out;
  positional_min_ = min;
  positional_max_ = max;
  positional_what_ = std::move(what);
  return *this;
}

bool Flags::given(const std::string& name) const {
  for (const auto& g : given_)
    if (g == name) return true;
  return false;
}

bool Flags::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage_.c_str(), stdout);
      return false;
    }
  }
  std::vector<std::string> positional;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() < 2 || a[0] != '-' || a == "--") {
      if (a == "--") {  // everything after is positional
        for (++i; i < argc; ++i) positional.push_back(argv[i]);
        break;
      }
      positional.push_back(a);
      continue;
    }
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const Spec* s = find(name);
    if (!s) throw ConfigError(name, detail::concat("unknown flag (", program_, " --help lists them)"));
    std::string value;
    if (eq != std::string::npos) {
      if (!s->takes_value && !s->optional_value) throw ConfigError(name, "takes no value");
      value = a.substr(eq + 1);
      if (value.empty()) throw ConfigError(name, "needs a value after '='");
    } else if (s->takes_value) {
      if (i + 1 >= argc) throw ConfigError(name, "needs a value");
      value = argv[++i];
    }
    s->set(value, name);
    given_.push_back(name);
  }
  // Environment fallbacks, for flags not given.
  for (const auto& s : specs_)
    if (s.env && !given(s.name))
      if (const auto v = env_value(s.env)) {
        s.set(*v, s.env);
        given_.push_back(s.name);
      }
  if (!positional_ && !positional.empty())
    throw ConfigError(positional[0], detail::concat("unexpected argument (", program_, " --help shows what it takes)"));
  if (positional_) {
    if (positional.size() > positional_max_)
      throw ConfigError(
          positional[positional_max_],
          detail::concat(
              "unexpected argument (", program_, " takes ", positional_max_ == 1 ? "one " : "at most ",
              positional_max_ == 1 ? positional_what_ : detail::concat(positional_max_, " ", positional_what_), ")"));
    if (positional.size() < positional_min_) {
      // The usage's first line shows where it goes.
      std::string synopsis = usage_.substr(0, usage_.find('\n'));
      if (synopsis.rfind("usage: ", 0) == 0) synopsis.erase(0, 7);
      throw ConfigError(program_, "name the " + positional_what_ + ": " + synopsis);
    }
    *positional_ = std::move(positional);
  }
  return true;
}

}  // namespace tessera
