// The JSON-schema compiler and the matcher, by the texts a schema's grammar accepts and refuses.
#include "model/grammar/json_schema.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/grammar/matcher.hpp"

namespace mqlm::model::grammar {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> compiled(const json& schema, bool strict = false) {
  auto result = compile_json_schema(schema, strict);
  if (auto* error = std::get_if<SchemaError>(&result)) ADD_FAILURE() << "refused: " << error->message;
  return std::get<std::shared_ptr<const Grammar>>(result);
}

// Whole text accepted: every byte allowed and the parse complete at the end.
bool accepts(const std::shared_ptr<const Grammar>& grammar, const std::string& text) {
  Matcher matcher(grammar);
  return matcher.advance(text) && matcher.can_end();
}

struct Case {
  const char* name;
  json schema;
  std::vector<std::string> accepted;
  std::vector<std::string> refused;
};

const std::vector<Case> kCases = {
    {"any object (json_object)",
     json{{"type", "object"}},
     {"{}", R"({"a":1})", R"({"a": [1, 2.5e-3, "x\n\u00e9"], "b": {"c": null, "d": true}})", "{\n  \"k\": false\n}",
      "{\"\xc3\xa9\": \"\xe2\x82\xac\xed\x9f\xbf\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"}"},
     {"", "[]", "1", "{", R"({"a":})", R"({"a" 1})", R"({'a':1})", R"({"a":1,})", "{}x", " {}", "{} ",
      "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xff\"}", "{\"a\":\"\xed\xbc\x9f\"}" /* a surrogate */,
      "{\"a\":\"\xc0\xaf\"}" /* overlong */, "{\"a\":\"\xe0\x80\xaf\"}", "{\"a\":\"\xf4\x90\x80\x80\"}" /* past U+10FFFF */, R"({"a":01})", R"({"a":1.})", R"({"a":tru})"}},
    {"properties in order, required and optional",
     json::parse(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                     "tags":{"type":"array","items":{"type":"string"}}},"required":["name"],
                     "additionalProperties":false})"),
     {R"({"name":"Ann"})", R"({"name":"Ann","age":3})", R"({"name":"Ann","tags":[]})",
      R"({"name": "Ann", "age": -12, "tags": ["a", "b"]})"},
     {"{}", R"({"age":3})", R"({"age":3,"name":"Ann"})", R"({"name":"Ann","age":3.5})", R"({"name":"Ann","x":1})",
      R"({"name":"Ann",})", R"({"name":"Ann","age":3,"age":4})", R"({"name":1})"}},
    {"nested objects",
     json::parse(R"({"type":"object","properties":{"point":{"type":"object","properties":{
                     "x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},"required":["point"]})"),
     {R"({"point":{"x":1,"y":-2.5E+10}})"},
     {R"({"point":{"x":1}})", R"({"point":{"y":1,"x":2}})", R"({"point":[1,2]})"}},
    {"enum and const",
     json::parse(R"({"type":"object","properties":{"color":{"enum":["red","green",3,null]},
                     "kind":{"const":"fixed"}},"required":["color","kind"]})"),
     {R"({"color":"red","kind":"fixed"})", R"({"color":3,"kind":"fixed"})", R"({"color":null,"kind":"fixed"})"},
     {R"({"color":"blue","kind":"fixed"})", R"({"color":"red","kind":"other"})", R"({"color":"re","kind":"fixed"})"}},
    {"array bounds",
     json::parse(R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})"),
     {"[true]", "[true,false,true]", "[ true , false ]"},
     {"[]", "[true,true,true,true]", "[1]"}},
    {"string lengths",
     json::parse(R"({"type":"string","minLength":2,"maxLength":3})"),
     {R"("ab")", R"("abc")", "\"\xc3\xa9\xc3\xa9\"", R"("\n\t")"},
     {R"("a")", R"("abcd")"}},
    {"formats",
     json::parse(R"({"type":"object","properties":{"d":{"type":"string","format":"date"},
                     "t":{"type":"string","format":"time"},"dt":{"type":"string","format":"date-time"},
                     "u":{"type":"string","format":"uuid"},"e":{"type":"string","format":"email"}},
                     "required":["d","t","dt","u","e"]})"),
     {R"({"d":"2024-02-28","t":"23:59:59Z","dt":"1999-12-31T00:00:00.123+05:30",)"
      R"("u":"123e4567-e89b-12d3-a456-426614174000","e":"ann.b+c@mail.example.org"})"},
     {R"({"d":"2024-02-30","t":"23:59:59Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b.cd"})",
      R"({"d":"2024-13-01","t":"23:59:59Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b.cd"})",
      R"({"d":"2024-01-01","t":"24:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b.cd"})",
      R"({"d":"2024-01-01","t":"23:00:00","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"a@b.cd"})",
      R"({"d":"2024-01-01","t":"23:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567e89b12d3a456426614174000","e":"a@b.cd"})",
      R"({"d":"2024-01-01","t":"23:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000","e":"ab.cd"})"}},
    {"anyOf, type lists and $ref recursion",
     json::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":["integer","null"]},
                     "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},
                     "$ref":"#/$defs/node"})"),
     {R"({"v":1,"next":null})", R"({"v":null,"next":{"v":2,"next":{"v":3,"next":null}}})"},
     {R"({"v":1})", R"({"v":"1","next":null})", R"({"v":1,"next":{}})"}},
    {"whitespace is bounded",
     json{{"type", "object"}},
     {"{\n" + std::string(20, ' ') + "}", "{ \"a\": 1 }", "{\n\t\"a\":\n  1\n}"},
     {"{\n" + std::string(21, ' ') + "}", "{  }", "{\n\n}", "{\r\n}"}},
};

TEST(JsonSchemaGrammar, AcceptsAndRefusesAsTheSchemaSays) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto grammar = compiled(c.schema);
    for (const std::string& text : c.accepted) EXPECT_TRUE(accepts(grammar, text)) << "should accept: " << text;
    for (const std::string& text : c.refused) EXPECT_FALSE(accepts(grammar, text)) << "should refuse: " << text;
  }
}

TEST(JsonSchemaGrammar, NumbersAreBounded) {
  auto grammar = compiled(json{{"type", "number"}});
  EXPECT_TRUE(accepts(grammar, std::string(16, '9') + "." + std::string(16, '1') + "e-123"));
  EXPECT_FALSE(accepts(grammar, std::string(17, '9')));
  EXPECT_FALSE(accepts(grammar, "1." + std::string(17, '1')));
  EXPECT_FALSE(accepts(grammar, "1e1234"));
}

TEST(JsonSchemaGrammar, TheMatcherSaysWhenTheTextMayAndMustEnd) {
  Matcher number(compiled(json{{"type", "integer"}}));
  ASSERT_TRUE(number.advance("12"));
  EXPECT_TRUE(number.can_end());
  EXPECT_FALSE(number.must_end());  // 123 would do too
  Matcher object(compiled(json{{"type", "object"}}));
  ASSERT_TRUE(object.advance("{\"a\""));
  EXPECT_FALSE(object.can_end());
  EXPECT_FALSE(object.advance("}"));  // refused: the state stays where it was
  ASSERT_TRUE(object.advance(":1}"));
  EXPECT_TRUE(object.must_end());
  EXPECT_FALSE(object.advance(" "));
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotEnforceNamingIt) {
  struct Refusal {
    json schema;
    bool strict;
    std::string says;
  };
  const std::vector<Refusal> refusals = {
      {json::parse(R"({"type":"string","pattern":"a+"})"), false, "the keyword 'pattern' is not supported"},
      {json::parse(R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})"), false,
       "/properties/n: the keyword 'minimum' is not supported"},
      {json::parse(R"({"type":"string","format":"hostname"})"), false, "format \"hostname\" is not supported"},
      {json::parse(R"({"type":"object","properties":{"a":{}},"required":["b"]})"), false, "'required' names \"b\""},
      {json::parse(R"({"type":"object","additionalProperties":true})"), true,
       "strict mode requires additionalProperties false"},
      {json::parse(R"({"type":"thing"})"), false, "unknown type \"thing\""},
      {json::parse(R"({"$ref":"#/$defs/missing"})"), false, "names nothing in the schema"},
      {json::parse(R"({"$ref":"https://example.com/s.json"})"), false, "only references within the schema"},
      {json::parse(R"({"type":"array","maxItems":100000})"), false, "'maxItems' must be an integer from 0 to 1024"},
      {json(false), false, "admits no value"},
      {json::parse(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), false, "admits no value"},
  };
  for (const Refusal& r : refusals) {
    auto result = compile_json_schema(r.schema, r.strict);
    ASSERT_TRUE(std::holds_alternative<SchemaError>(result)) << r.schema.dump();
    EXPECT_NE(std::get<SchemaError>(result).message.find(r.says), std::string::npos)
        << std::get<SchemaError>(result).message;
  }
  json deep = json{{"type", "string"}};
  for (int i = 0; i < 40; ++i) deep = json{{"type", "array"}, {"items", deep}};
  auto result = compile_json_schema(deep, false);
  ASSERT_TRUE(std::holds_alternative<SchemaError>(result));
  EXPECT_NE(std::get<SchemaError>(result).message.find("nested deeper than 32"), std::string::npos);
}

TEST(JsonSchemaGrammar, NestingDeeperThanTheStackBoundIsRefusedNotFollowed) {
  auto grammar = compiled(json{{"type", "array"}});
  EXPECT_TRUE(accepts(grammar, std::string(60, '[') + std::string(60, ']')));
  Matcher deep(grammar);
  EXPECT_FALSE(deep.advance(std::string(kMaxStackDepth, '[')));
}

}  // namespace
}  // namespace mqlm::model::grammar
