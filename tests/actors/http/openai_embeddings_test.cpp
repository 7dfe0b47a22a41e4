// POST /v1/embeddings' body into Submits with pooling, and the finals' vectors into OpenAI's answer.
#include <gtest/gtest.h>

#include <string>

#include "actors/http/openai_embeddings.hpp"

namespace mqlm::actors::openai {
namespace {

using messages::FinalEvent;
using messages::PromptKind;
using nlohmann::json;

constexpr std::uint8_t kMean = 1, kLast = 2;

EmbeddingRequest parse_ok(const json& body, std::uint8_t pooling = kMean) {
  auto parsed = parse_embedding_request(body.dump(), pooling);
  if (auto* error = std::get_if<ApiError>(&parsed)) {
    ADD_FAILURE() << "refused: " << error->message;
    return {};
  }
  return std::get<EmbeddingRequest>(std::move(parsed));
}

TEST(EmbeddingRequest, EveryInputShapeBecomesSubmitsWithTheServersPooling) {
  auto one = parse_ok({{"model", "tiny"}, {"input", "hello"}, {"user", "u1"}}, kLast);
  ASSERT_EQ(one.submits.size(), 1u);
  EXPECT_EQ(one.submits[0].prompt_kind, static_cast<std::uint8_t>(PromptKind::text));
  EXPECT_EQ(one.submits[0].text, "hello");
  EXPECT_EQ(one.submits[0].model, "tiny");
  EXPECT_EQ(one.submits[0].pooling, kLast);
  EXPECT_FALSE(one.base64);
  auto texts = parse_ok({{"input", {"a", "b", "c"}}, {"encoding_format", "base64"}, {"dimensions", 256}});
  ASSERT_EQ(texts.submits.size(), 3u);
  EXPECT_EQ(texts.submits[2].text, "c");
  EXPECT_EQ(texts.submits[2].pooling, kMean);
  EXPECT_TRUE(texts.base64);
  EXPECT_EQ(texts.dimensions, 256);
  auto ids = parse_ok({{"input", {1, 2, 3}}, {"encoding_format", "float"}});
  ASSERT_EQ(ids.submits.size(), 1u);
  EXPECT_EQ(ids.submits[0].prompt_kind, static_cast<std::uint8_t>(PromptKind::tokens));
  EXPECT_EQ(ids.submits[0].tokens, (std::vector<std::int32_t>{1, 2, 3}));
  auto lists = parse_ok({{"input", {{1, 2}, {3}}}});
  ASSERT_EQ(lists.submits.size(), 2u);
  EXPECT_EQ(lists.submits[1].tokens, (std::vector<std::int32_t>{3}));
}

TEST(EmbeddingRequest, BadBodiesNameTheField) {
  auto param = [](const std::string& body) {
    auto parsed = parse_embedding_request(body, kMean);
    auto* error = std::get_if<ApiError>(&parsed);
    return error != nullptr && error->status == 400 ? error->param.value_or("(none)") : "(accepted)";
  };
  EXPECT_EQ(param(R"({"model": "tiny"})"), "input");
  EXPECT_EQ(param(R"({"input": 5})"), "input");
  EXPECT_EQ(param(R"({"input": ""})"), "input");
  EXPECT_EQ(param(R"({"input": []})"), "input");
  EXPECT_EQ(param(R"({"input": ["a", ""]})"), "input[1]");
  EXPECT_EQ(param(R"({"input": ["a", 5]})"), "input[1]");
  EXPECT_EQ(param(R"({"input": [[1], [2, -1]]})"), "input[1][1]");
  EXPECT_EQ(param(R"({"input": "x", "encoding_format": "int8"})"), "encoding_format");
  EXPECT_EQ(param(R"({"input": "x", "dimensions": 0})"), "dimensions");
  EXPECT_EQ(param(R"({"input": "x", "user": 5})"), "user");
  EXPECT_EQ(param(R"({"input": "x", "pooling": "cls"})"), "pooling");
  EXPECT_EQ(param(json{{"input", std::vector<std::string>(kMaxEmbeddingInputs + 1, "x")}}.dump()), "input");
  EXPECT_EQ(param(json{{"input", std::vector<std::string>(kMaxEmbeddingInputs, "x")}}.dump()), "(accepted)");
  EXPECT_EQ(param("[1]"), "(none)");
}

TEST(EmbeddingAnswer, Base64IsLittleEndianFloat32) {
  EXPECT_EQ(base64_floats({}), "");
  EXPECT_EQ(base64_floats({1.0f}), "AACAPw==");
  EXPECT_EQ(base64_floats({1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(base64_floats({0.5f, 0.25f, -0.0f}), "AAAAPwAAgD4AAACA");
}

FinalEvent finished(std::vector<float> embedding, std::uint32_t prompt_tokens) {
  FinalEvent final_event;
  final_event.finish = static_cast<std::uint8_t>(messages::FinishReason::stop);
  final_event.prompt_tokens = prompt_tokens;
  final_event.embedding = std::move(embedding);
  return final_event;
}

TEST(EmbeddingAnswer, VectorsInOrderWithUsage) {
  auto request = parse_ok({{"model", "tiny"}, {"input", {"a", "b"}}});
  auto body = embeddings_json(request, {finished({0.6f, 0.8f}, 3), finished({1.0f, 0.0f}, 4)});
  ASSERT_TRUE(std::holds_alternative<json>(body));
  EXPECT_EQ(std::get<json>(body), json::parse(R"({"object": "list", "model": "tiny",
      "data": [{"object": "embedding", "index": 0, "embedding": [0.6000000238418579, 0.800000011920929]},
               {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]}],
      "usage": {"prompt_tokens": 7, "total_tokens": 7}})"));
  request.base64 = true;
  EXPECT_EQ(std::get<json>(embeddings_json(request, {finished({1.0f}, 1), finished({1.0f, -2.0f}, 1)}))["data"][1]["embedding"],
            "AACAPwAAAMA=");
}

TEST(EmbeddingAnswer, AFailedInputOrAnotherWidthIsTheAnswersError) {
  auto request = parse_ok({{"input", {"a", "b"}}, {"dimensions", 2}});
  FinalEvent too_long;
  too_long.finish = static_cast<std::uint8_t>(messages::FinishReason::error);
  too_long.error = static_cast<std::uint16_t>(messages::RequestError::prompt_too_long);
  too_long.message = "the input makes 9000 tokens";
  auto failed = embeddings_json(request, {finished({0.6f, 0.8f}, 3), too_long});
  ASSERT_TRUE(std::holds_alternative<ApiError>(failed));
  EXPECT_EQ(std::get<ApiError>(failed).status, 400);
  EXPECT_EQ(std::get<ApiError>(failed).code, "context_length_exceeded");
  EXPECT_EQ(std::get<ApiError>(failed).message, "input[1]: the input makes 9000 tokens");
  request.dimensions = 3;
  auto wrong_width = embeddings_json(request, {finished({0.6f, 0.8f}, 3), finished({1.0f, 0.0f}, 1)});
  ASSERT_TRUE(std::holds_alternative<ApiError>(wrong_width));
  EXPECT_EQ(std::get<ApiError>(wrong_width).param, "dimensions");
  auto empty = embeddings_json(request, {finished({}, 3)});
  ASSERT_TRUE(std::holds_alternative<ApiError>(empty));
  EXPECT_EQ(std::get<ApiError>(empty).status, 500);
}

}  // namespace
}  // namespace mqlm::actors::openai
