// Typed JSON member reads for the config parsers; see json_fields.h.
#include "model/config/json_fields.h"

#include "absl/strings/str_cat.h"

namespace dsv4::config_internal {

absl::Status FieldError(std::string_view where, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(where), " \"", std::string(field), "\": ", std::string(what)));
}

std::string Describe(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

bool FieldReader::Has(std::string_view key) const {
  auto it = object_.find(std::string(key));
  return it != object_.end();
}

absl::Status FieldReader::Int(std::string_view key, int64_t* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Error(key, "integer out of range");
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (!v.is_number_integer()) return Error(key, absl::StrCat("expected an integer, got ", Describe(v)));
  *out = v.get<int64_t>();
  return absl::OkStatus();
}

absl::Status FieldReader::Double(std::string_view key, double* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (!v.is_number()) return Error(key, absl::StrCat("expected a number, got ", Describe(v)));
  *out = v.get<double>();
  return absl::OkStatus();
}

absl::Status FieldReader::Bool(std::string_view key, bool* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (!v.is_boolean()) return Error(key, absl::StrCat("expected true or false, got ", Describe(v)));
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status FieldReader::String(std::string_view key, std::string* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (!v.is_string()) return Error(key, absl::StrCat("expected a string, got ", Describe(v)));
  *out = v.get<std::string>();
  return absl::OkStatus();
}

absl::Status FieldReader::IntList(std::string_view key, std::vector<int64_t>* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (!v.is_array()) return Error(key, absl::StrCat("expected a list of integers, got ", Describe(v)));
  std::vector<int64_t> values;
  values.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer()) {
      return Error(key, absl::StrCat("entry ", i, " is not an integer: ", Describe(v[i])));
    }
    values.push_back(v[i].get<int64_t>());
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status FieldReader::StringList(std::string_view key, std::vector<std::string>* out) const {
  if (!Has(key)) return absl::OkStatus();
  const Json& v = Get(key);
  if (!v.is_array()) return Error(key, absl::StrCat("expected a list of strings, got ", Describe(v)));
  std::vector<std::string> values;
  values.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      return Error(key, absl::StrCat("entry ", i, " is not a string: ", Describe(v[i])));
    }
    values.push_back(v[i].get<std::string>());
  }
  *out = std::move(values);
  return absl::OkStatus();
}

absl::Status FieldReader::Object(std::string_view key, const Json** out) const {
  if (!Has(key)) return Error(key, "missing");
  const Json& v = Get(key);
  if (!v.is_object()) return Error(key, absl::StrCat("expected an object, got ", Describe(v)));
  *out = &v;
  return absl::OkStatus();
}

}  // namespace dsv4::config_internal
