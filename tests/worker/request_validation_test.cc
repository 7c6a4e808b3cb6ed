// Every rule of ValidateGenerateRequest: a valid request passes, and each bad field gets INVALID_ARGUMENT
// whose message names the field and the limit.
#include "proto/request_validation.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

constexpr RequestLimits kLimits{.vocab_size = 100, .max_context = 64};

dsv4::v1::GenerateRequest Valid() {
  dsv4::v1::GenerateRequest r;
  for (int t : {1, 2, 3}) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_new_tokens(8);
  return r;
}

void ExpectInvalid(const dsv4::v1::GenerateRequest& r, const std::string& field, const std::string& limit) {
  const absl::Status s = ValidateGenerateRequest(r, kLimits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(field), std::string::npos) << s;
  EXPECT_NE(s.message().find(limit), std::string::npos) << s;
}

TEST(RequestValidation, ValidRequestPasses) {
  EXPECT_TRUE(ValidateGenerateRequest(Valid(), kLimits).ok());
  auto r = Valid();
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_p(1.0f);
  r.mutable_sampling()->set_top_k(5);
  r.mutable_sampling()->set_min_p(0.1f);
  r.mutable_sampling()->add_stop_token_ids(99);
  r.mutable_sampling()->set_max_new_tokens(61);  // 3 + 61 = 64 = max_context exactly
  EXPECT_TRUE(ValidateGenerateRequest(r, kLimits).ok());
}

TEST(RequestValidation, EmptyPrompt) {
  auto r = Valid();
  r.clear_prompt_token_ids();
  ExpectInvalid(r, "prompt_token_ids", "at least 1");
}

TEST(RequestValidation, TokenOutsideVocab) {
  auto r = Valid();
  r.add_prompt_token_ids(100);
  ExpectInvalid(r, "prompt_token_ids[3] = 100", "[0, 100)");
  r = Valid();
  r.add_prompt_token_ids(-1);
  ExpectInvalid(r, "prompt_token_ids[3] = -1", "[0, 100)");
}

TEST(RequestValidation, ContextOverflow) {
  auto r = Valid();
  r.mutable_sampling()->set_max_new_tokens(62);
  ExpectInvalid(r, "max_new_tokens", "max context 64");
}

TEST(RequestValidation, MaxNewTokensMissing) {
  auto r = Valid();
  r.mutable_sampling()->set_max_new_tokens(0);
  ExpectInvalid(r, "sampling.max_new_tokens", ">= 1");
  r.clear_sampling();
  ExpectInvalid(r, "sampling", "max_new_tokens");
}

TEST(RequestValidation, NegativeTemperature) {
  auto r = Valid();
  r.mutable_sampling()->set_temperature(-0.5f);
  ExpectInvalid(r, "sampling.temperature", ">= 0");
  r.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
  ExpectInvalid(r, "sampling.temperature", ">= 0");
}

TEST(RequestValidation, TopPOutsideRange) {
  for (float p : {1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    auto r = Valid();
    r.mutable_sampling()->set_top_p(p);
    ExpectInvalid(r, "sampling.top_p", "(0, 1]");
  }
}

TEST(RequestValidation, NegativeTopK) {
  auto r = Valid();
  r.mutable_sampling()->set_top_k(-1);
  ExpectInvalid(r, "sampling.top_k", ">= 0");
}

TEST(RequestValidation, TopLogprobs) {
  auto r = Valid();
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(20);
  EXPECT_TRUE(ValidateGenerateRequest(r, kLimits).ok());
  r.mutable_sampling()->set_top_logprobs(21);
  ExpectInvalid(r, "sampling.top_logprobs", "[0, 20]");
  r.mutable_sampling()->set_top_logprobs(-1);
  ExpectInvalid(r, "sampling.top_logprobs", "[0, 20]");
  r.mutable_sampling()->set_top_logprobs(3);
  r.mutable_sampling()->set_logprobs(false);
  ExpectInvalid(r, "sampling.top_logprobs", "needs sampling.logprobs");
}

TEST(RequestValidation, MinPOutsideRange) {
  auto r = Valid();
  r.mutable_sampling()->set_min_p(1.5f);
  ExpectInvalid(r, "sampling.min_p", "[0, 1]");
}

TEST(RequestValidation, StopTokens) {
  auto r = Valid();
  r.mutable_sampling()->add_stop_token_ids(100);
  ExpectInvalid(r, "sampling.stop_token_ids[0] = 100", "[0, 100)");
  r = Valid();
  for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(1);
  ExpectInvalid(r, "sampling.stop_token_ids", "limit 64");
}

TEST(RequestValidation, ResumeGenerated) {
  auto r = Valid();
  r.set_resume_generated(3);
  ExpectInvalid(r, "resume_generated = 3", "[0, 3)");
  r.set_resume_generated(-1);
  ExpectInvalid(r, "resume_generated = -1", "[0, 3)");
  r = Valid();
  r.set_resume_generated(2);
  r.mutable_sampling()->set_max_new_tokens(2);
  ExpectInvalid(r, "resume_generated = 2", "max_new_tokens = 2");
  // Resumed tokens count once: original prompt 1 + max_new_tokens 63 = 64 fits.
  r.mutable_sampling()->set_max_new_tokens(63);
  EXPECT_TRUE(ValidateGenerateRequest(r, kLimits).ok());
}

TEST(RequestValidation, RequestIdTooLong) {
  auto r = Valid();
  r.set_request_id(std::string(300, 'x'));
  ExpectInvalid(r, "request_id", "limit 256");
}

}  // namespace
}  // namespace dsv4
