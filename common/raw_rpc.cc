// See raw_rpc.h.
#include "common/raw_rpc.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/slice.h"

namespace dsv4 {

namespace {

// Names of the string fields reachable from `d` ("request_id"), for the parse error: in proto3 a string that
// is not valid UTF-8 makes the whole message fail to parse.
void StringFields(const google::protobuf::Descriptor* d, std::vector<const google::protobuf::Descriptor*>& seen,
                  std::vector<std::string>& out) {
  if (std::find(seen.begin(), seen.end(), d) != seen.end()) return;
  seen.push_back(d);
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) out.push_back(f->name());
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) StringFields(f->message_type(), seen, out);
  }
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  std::string data;
  if (bytes.Valid()) {
    if (!bytes.Dump(&slices).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request could not be parsed as ", message->GetTypeName(), ": unreadable message body"));
    }
    data.reserve(bytes.Length());
    for (const grpc::Slice& s : slices) data.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (message->ParseFromString(data)) return absl::OkStatus();
  std::vector<const google::protobuf::Descriptor*> seen;
  std::vector<std::string> strings;
  StringFields(message->GetDescriptor(), seen, strings);
  return absl::InvalidArgumentError(absl::StrCat(
      "the request could not be parsed as ", message->GetTypeName(), " (", data.size(),
      " bytes): they are not a valid encoding of that message",
      strings.empty() ? "" : absl::StrCat(", or a string field (", absl::StrJoin(strings, ", "),
                                          ") is not valid UTF-8")));
}

void SerializeTo(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out) {
  const grpc::Slice slice(message.SerializeAsString());
  *out = grpc::ByteBuffer(&slice, 1);
}

}  // namespace dsv4
