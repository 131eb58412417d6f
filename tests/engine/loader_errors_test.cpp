// Every malformed-input case gives a clear message naming the file, tensor or field at fault.
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "test_math.h"
#include "test_models.h"

namespace kiln::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::make_model;

const char* kQ = "model.language_model.layers.3.self_attn.q_proj.weight";

// Rewrites a safetensors header through `edit`, keeping the payload bytes.
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  json h = json::parse(bytes.substr(8, n));
  edit(h);
  std::string nh = h.dump();
  while (nh.size() % 8) nh += ' ';
  const uint64_t nl = nh.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&nl), 8);
  out << nh << bytes.substr(8 + n);
}

// Rewrites config.json (or another JSON file of the model) through `edit`.
void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json c;
  {
    std::ifstream in(path);
    c = json::parse(in);
  }
  edit(c);
  std::ofstream(path, std::ios::trunc) << c.dump();
}

void expect_load_error(const std::string& dir, std::initializer_list<std::string> parts) {
  auto m = Model::load(dir);
  ASSERT_FALSE(m.ok()) << "loaded a malformed model";
  for (const auto& p : parts) EXPECT_NE(m.error().find(p), std::string::npos) << "message: " << m.error();
}

TEST(LoaderErrors, MissingTensorIsNamed) {
  const std::string dir = make_model(TinyModelOptions{});
  edit_header(dir + "/model.safetensors", [](json& h) {
    h["renamed.q_proj"] = h[kQ];
    h.erase(kQ);
  });
  expect_load_error(dir, {"missing tensor", kQ});
}

TEST(LoaderErrors, WrongShapeNamesTensorFileAndShapes) {
  const std::string dir = make_model(TinyModelOptions{});
  edit_header(dir + "/model.safetensors", [](json& h) { h[kQ]["shape"] = {64, 256}; });  // same bytes, transposed
  expect_load_error(dir, {kQ, "model.safetensors", "shape [64, 256]", "expected [256, 64]"});
}

TEST(LoaderErrors, UnsupportedDtypeIsNamed) {
  const std::string dir = make_model(TinyModelOptions{});
  edit_header(dir + "/model.safetensors", [](json& h) { h[kQ]["dtype"] = "I16"; });
  expect_load_error(dir, {kQ, "unsupported dtype I16"});
}

TEST(LoaderErrors, TruncatedFileIsReported) {
  const std::string dir = make_model(TinyModelOptions{});
  const std::string f = dir + "/model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 100);
  expect_load_error(dir, {"model.safetensors", "truncated"});
  fs::resize_file(f, 4);
  expect_load_error(dir, {"model.safetensors", "truncated"});
}

TEST(LoaderErrors, ConfigFieldOutOfRangeIsNamed) {
  const std::string dir = make_model(TinyModelOptions{});
  const std::string path = dir + "/config.json";
  auto rewrite = [&](const std::function<void(json&)>& edit) {
    std::ifstream in(path);
    json c = json::parse(in);
    edit(c);
    std::ofstream(path, std::ios::trunc) << c.dump();
  };
  rewrite([](json& c) { c["text_config"]["num_experts_per_tok"] = 99; });
  expect_load_error(dir, {"text_config.num_experts_per_tok", "99", "out of range"});
  rewrite([](json& c) {
    c["text_config"]["num_experts_per_tok"] = 2;
    c["text_config"]["num_key_value_heads"] = 3;
  });
  expect_load_error(dir, {"num_key_value_heads", "num_attention_heads"});
  rewrite([](json& c) {
    c["text_config"]["num_key_value_heads"] = 2;
    c["text_config"].erase("hidden_size");
  });
  expect_load_error(dir, {"text_config.hidden_size is missing"});
  rewrite([](json& c) {
    c["text_config"]["hidden_size"] = 64;
    c["text_config"]["layer_types"][1] = "sliding_attention";
  });
  expect_load_error(dir, {"layer_types[1]", "sliding_attention"});
}

TEST(LoaderErrors, ShardMissingFromIndexIsNamed) {
  TinyModelOptions o;
  o.shards = 2;
  const std::string dir = make_model(o);
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_load_error(dir, {"model-00002-of-00002.safetensors", "cannot open"});
}

TEST(LoaderErrors, VisionAndMtpTensorsAreSkippedOtherExtrasWarned) {
  const std::string dir = make_model(TinyModelOptions{});
  edit_header(dir + "/model.safetensors", [](json& h) {
    // Empty tensors: only the names matter here (tensors may not share bytes).
    const json empty = {{"dtype", "BF16"}, {"shape", {0, 64}}, {"data_offsets", {0, 0}}};
    h["mtp.fc.weight"] = empty;
    h["model.visual.patch_embed.proj.weight"] = empty;
    h["model.language_model.layers.0.mystery"] = empty;
  });
  auto m = Model::load(dir);
  ASSERT_TRUE(m.ok()) << m.error();
  ASSERT_EQ((*m)->weights().warnings.size(), 1u);
  EXPECT_NE((*m)->weights().warnings[0].find("layers.0.mystery"), std::string::npos);
}

TEST(SessionErrors, BadTokenAndExhaustedMemoryAreReportedWithoutDamage) {
  EngineOptions opt;
  opt.max_sessions = 2;
  TinyModelOptions o;
  const std::string dir = make_model(o);
  // Budget: the 2 sessions' fixed state plus exactly 4 pages of 16 tokens.
  auto probe = Model::load(dir, opt);
  ASSERT_TRUE(probe.ok()) << probe.error();
  opt.kv_budget_bytes = 2 * (*probe)->plan().state_bytes_per_session + 4 * (*probe)->plan().page_bytes;
  auto m = Model::load(dir, opt);
  ASSERT_TRUE(m.ok()) << m.error();
  auto s = (*m)->open_session();
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> bad = {1, 2, 999};
  auto r = (*s)->append(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("999"), std::string::npos) << r.error();
  std::vector<int32_t> toks(60, 3);
  ASSERT_TRUE((*s)->append(toks).ok());  // 4 pages
  auto s2 = (*m)->open_session();
  ASSERT_TRUE(s2.ok());
  // More than the whole pool: refused, and the idle session's pages are not taken for nothing.
  auto full = (*s2)->append(std::vector<int32_t>(65, 1));
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().find("context memory exhausted"), std::string::npos) << full.error();
  EXPECT_EQ((*s2)->size(), 0);
  EXPECT_EQ((*m)->kv_reclaims(), 0);
  auto s3 = (*m)->open_session();
  ASSERT_FALSE(s3.ok());
  EXPECT_NE(s3.error().find("session limit"), std::string::npos);
  s->reset();  // closing a session returns its pages
  EXPECT_TRUE((*s2)->append(std::vector<int32_t>(5, 1)).ok());
}

// A tiny model for two sessions whose KV pool holds exactly `pages` pages of 16 tokens.
Result<std::unique_ptr<Model>> model_with_kv_pages(const std::string& dir, int64_t pages) {
  EngineOptions opt;
  opt.max_sessions = 2;
  auto probe = Model::load(dir, opt);
  if (!probe) return probe;
  opt.kv_budget_bytes = 2 * (*probe)->plan().state_bytes_per_session + pages * (*probe)->plan().page_bytes;
  return Model::load(dir, opt);
}

// A full pool takes the pages of the least recently used idle session (an agent running a tool)
// instead of failing the call; that session re-prefills its history on its next call and goes on
// with the same logits as if nothing happened.
TEST(SessionErrors, FullKvReclaimsAnIdleSessionWhichRebuildsOnItsNextCall) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_kv_pages(dir, 6);
  ASSERT_TRUE(m.ok()) << m.error();
  ASSERT_EQ((*m)->plan().pages, 6);
  const int64_t V = (*m)->config().vocab_size;
  const auto first = testing::random_tokens(60, V, 21), more = testing::random_tokens(10, V, 22);
  auto a = (*m)->open_session();
  ASSERT_TRUE((*a)->append(first).ok());  // 4 of 6 pages
  auto b = (*m)->open_session();
  ASSERT_TRUE((*b)->append(testing::random_tokens(40, V, 23)).ok());  // 3 pages: a's are taken
  EXPECT_EQ((*m)->kv_reclaims(), 1);
  EXPECT_EQ((*a)->size(), 60);  // its history stays
  const SessionCheckpoint cp = (*a)->checkpoint();
  auto after = (*a)->append(more);  // rebuilds 60 tokens (taking b's pages), then appends 10
  ASSERT_TRUE(after.ok()) << after.error();
  EXPECT_EQ((*a)->rebuilt_tokens(), 60);
  EXPECT_EQ((*m)->kv_reclaims(), 2);
  auto roomy = Model::load(dir, EngineOptions{});
  auto ref = (*roomy)->open_session();
  ASSERT_TRUE((*ref)->append(first).ok());
  auto want = (*ref)->append(more);
  EXPECT_LE(testing::rel_l2(after->data(), want->data(), V), 1e-6);
  // Rewinding a reclaimed session rebuilds only the checkpoint's tokens.
  ASSERT_TRUE((*b)->rewind((*b)->checkpoint()).ok());  // b was reclaimed: rebuilds its 40
  EXPECT_EQ((*b)->rebuilt_tokens(), 40);
  ASSERT_TRUE((*a)->rewind(cp).ok());
  EXPECT_EQ((*a)->size(), 60);
  EXPECT_EQ((*a)->last_logits().size(), size_t(V));
}

// The same on the scheduler's side: a generating session whose next token needs a page takes an
// idle session's; the speculative up-front reservation of max_tokens takes nothing from anyone.
TEST(SessionErrors, GenerateTakesAnIdleSessionsPagesOnlyWhenATokenNeedsOne) {
  const std::string dir = make_model(TinyModelOptions{});
  auto m = model_with_kv_pages(dir, 6);
  ASSERT_TRUE(m.ok()) << m.error();
  const int64_t V = (*m)->config().vocab_size;
  auto idle = (*m)->open_session();
  ASSERT_TRUE((*idle)->append(testing::random_tokens(60, V, 31)).ok());  // 4 pages
  auto gen = (*m)->open_session();
  ASSERT_TRUE((*gen)->append(testing::random_tokens(30, V, 32)).ok());   // 2 pages: the pool is full
  GenerateOptions g;
  g.max_tokens = 2;  // 32 tokens: still within its 2 pages
  ASSERT_TRUE((*gen)->generate(g).ok());
  EXPECT_EQ((*m)->kv_reclaims(), 0);
  g.max_tokens = 10;  // the 33rd token needs a third page
  auto r = (*gen)->generate(g);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->tokens.size(), 10u);
  EXPECT_EQ((*m)->kv_reclaims(), 1);
  ASSERT_TRUE((*idle)->generate(g).ok());  // rebuilds its 60 tokens first
  EXPECT_EQ((*idle)->rebuilt_tokens(), 60);
}

// Malformed JSON used to throw out of the loader (nlohmann's get<> and value() on a null or a

// Per call, sets a model's config.json to its original content with one edit applied.
std::function<void(const std::function<void(json&)>&)> config_editor(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  const json original = json::parse(in);
  return [path, original](const std::function<void(json&)>& edit) {
    edit_json(path, [&](json& c) {
      c = original;
      edit(c);
    });
  };
}

// value of the wrong type), aborting the process: each case is an error naming the field.
TEST(LoaderErrors, ConfigFieldsOfTheWrongTypeAreNamedNotThrown) {
  const std::string dir = make_model(TinyModelOptions{});
  const auto with = config_editor(dir);
  with([](json& c) { c["model_type"] = nullptr; });  // null reads as absent: the text model_type
  EXPECT_TRUE(Model::load(dir).ok());
  with([](json& c) { c["tie_word_embeddings"] = nullptr; });
  EXPECT_TRUE(Model::load(dir).ok());
  with([](json& c) { c["model_type"] = 5; });
  expect_load_error(dir, {"config.json: model_type has the wrong type (5)"});
  with([](json& c) { c["tie_word_embeddings"] = "no"; });
  expect_load_error(dir, {"config.json: tie_word_embeddings has the wrong type"});
  with([](json& c) { c["text_config"]["tie_word_embeddings"] = 0; });
  expect_load_error(dir, {"text_config.tie_word_embeddings has the wrong type"});
  with([](json& c) { c["text_config"]["rope_parameters"]["rope_theta"] = "1e7"; });
  expect_load_error(dir, {"text_config.rope_parameters.rope_theta has the wrong type"});
  with([](json& c) { c["text_config"]["eos_token_id"] = "481"; });
  expect_load_error(dir, {"text_config.eos_token_id", "expected a token id"});
  with([](json& c) { c["text_config"]["eos_token_id"] = json::array({1, nullptr}); });
  expect_load_error(dir, {"text_config.eos_token_id", "expected a token id"});
  with([](json& c) { c["text_config"]["dtype"] = 16; });
  expect_load_error(dir, {"text_config.dtype has the wrong type"});
  with([](json& c) { c["text_config"] = json::array(); });
  expect_load_error(dir, {"text_config has the wrong type"});
}

TEST(LoaderErrors, NonStringWeightMapEntryIsNamedNotThrown) {
  TinyModelOptions o;
  o.shards = 2;
  const std::string dir = make_model(o);
  const std::string index = dir + "/model.safetensors.index.json";
  json original;
  {
    std::ifstream in(index);
    original = json::parse(in);
  }
  edit_json(index, [](json& j) { j["weight_map"]["model.language_model.extra.weight"] = 3; });
  expect_load_error(dir, {"model.safetensors.index.json", "\"model.language_model.extra.weight\" is 3",
                          "not a shard file name"});
  edit_json(index, [&](json& j) {
    j = original;
    j["weight_map"]["model.language_model.norm.weight"] = nullptr;
  });
  expect_load_error(dir, {"\"model.language_model.norm.weight\" is null"});
}

// Only rope_theta and partial_rotary_factor were read: a config asking for YaRN or linear
// scaling ran with plain RoPE (wrong positions, no error). The accepted forms are the released
// one (rope_type "default" with the M-RoPE fields) and the older rope_scaling {type: "mrope"}.
TEST(LoaderErrors, RopeScalingOtherThanDefaultOrMropeIsRefused) {
  const std::string dir = make_model(TinyModelOptions{});
  const auto with = config_editor(dir);
  with([](json& c) { c["text_config"]["rope_parameters"]["rope_type"] = "yarn"; });
  expect_load_error(dir, {"text_config.rope_parameters.rope_type = \"yarn\" is not supported"});
  with([](json& c) { c["text_config"]["rope_parameters"]["factor"] = 4.0; });
  expect_load_error(dir, {"text_config.rope_parameters.factor", "not supported"});
  with([](json& c) { c["text_config"]["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  expect_load_error(dir, {"text_config.rope_scaling.type = \"linear\" is not supported"});
  with([](json& c) { c["text_config"]["rope_scaling"] = "yarn"; });
  expect_load_error(dir, {"text_config.rope_scaling has the wrong type"});
  with([](json& c) { c["text_config"]["rope_parameters"]["mrope_section"] = "11,11,10"; });
  expect_load_error(dir, {"text_config.rope_parameters.mrope_section"});
  // Accepted: the released form as make_tiny writes it, no rope_type, rope_scaling null, and the
  // older form (top-level rope_theta, rope_scaling of type mrope).
  with([](json&) {});
  EXPECT_TRUE(Model::load(dir).ok());
  with([](json& c) {
    c["text_config"]["rope_parameters"].erase("rope_type");
    c["text_config"]["rope_scaling"] = nullptr;
  });
  EXPECT_TRUE(Model::load(dir).ok());
  double theta = 0;
  with([&theta](json& c) {
    json& t = c["text_config"];
    theta = t["rope_parameters"]["rope_theta"].get<double>();
    t["rope_theta"] = theta;
    t.erase("rope_parameters");
    t["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}};
  });
  auto old_form = Model::load(dir);
  ASSERT_TRUE(old_form.ok()) << old_form.error();
  EXPECT_EQ((*old_form)->config().rope_theta, theta);
}

// The example configs of the released checkpoints still parse.
TEST(LoaderErrors, ReleasedConfigsParse) {
  for (const char* name : {"qwen3.6-35b-a3b", "qwen3.6-27b"}) {
    auto c = load_model_config(std::string(KILN_SOURCE_DIR) + "/examples/models/" + name + ".config.json");
    ASSERT_TRUE(c.ok()) << name << ": " << c.error();
    EXPECT_EQ(c->rope_theta, 1e7);
    EXPECT_EQ(c->rotary_dim, 64);
  }
}

// Header values that were cast or multiplied unchecked: negative or float dims, a numel that
// overflows int64 (signed overflow: the byte check could pass with 0 bytes), negative or float
// offsets, and tensors sharing bytes. Each is refused, naming the file and tensor.
TEST(LoaderErrors, HostileTensorHeadersAreRefused) {
  const std::string dir = make_model(TinyModelOptions{});
  const std::string file = dir + "/model.safetensors";
  const std::string norm = "model.language_model.norm.weight";
  const std::string other = "model.language_model.layers.0.input_layernorm.weight";
  {
    std::ifstream in(file, std::ios::binary);
    std::ofstream(dir + "/original.bin", std::ios::binary) << in.rdbuf();
  }
  auto with = [&](const std::function<void(json&)>& edit) {
    fs::copy_file(dir + "/original.bin", file, fs::copy_options::overwrite_existing);
    edit_header(file, edit);
  };
  with([](json& h) { h["model.visual.foo"] = {{"dtype", "U8"}, {"shape", {-1, -1}}, {"data_offsets", {0, 1}}}; });
  expect_load_error(dir, {"model.safetensors", "model.visual.foo", "non-negative integers", "[-1,-1]"});
  with([](json& h) {
    h["model.visual.foo"] = {{"dtype", "BF16"}, {"shape", {uint64_t(1) << 32, uint64_t(1) << 31}}, {"data_offsets", {0, 0}}};
  });
  expect_load_error(dir, {"model.visual.foo", "more elements than fit in 64 bits"});
  with([](json& h) {
    h["model.visual.foo"] = {{"dtype", "F64"}, {"shape", {uint64_t(1) << 62}}, {"data_offsets", {0, 0}}};
  });
  expect_load_error(dir, {"model.visual.foo", "more bytes than fit in 64 bits"});
  with([&](json& h) { h[norm]["shape"] = {1e30}; });
  expect_load_error(dir, {norm, "non-negative integers"});
  with([&](json& h) { h[norm]["data_offsets"] = {-128, 0}; });
  expect_load_error(dir, {norm, "bad data_offsets [-128,0]"});
  with([&](json& h) { h[norm]["data_offsets"] = {1.5e30, 2e30}; });
  expect_load_error(dir, {norm, "bad data_offsets"});
  with([&](json& h) { h[norm] = {1, 2}; });
  expect_load_error(dir, {norm, "malformed header entry"});
  with([&](json& h) { h[norm]["dtype"] = 5; });
  expect_load_error(dir, {norm, "dtype is missing or not a string"});
  with([&](json& h) { h[norm]["data_offsets"] = h[other]["data_offsets"]; });
  expect_load_error(dir, {"model.safetensors", "overlap", norm, other});
  with([](json&) {});
  EXPECT_TRUE(Model::load(dir).ok());
}

// An index could name any file on the machine as a shard ("../x", "/abs/x").
TEST(LoaderErrors, IndexShardOutsideTheModelDirectoryIsRefused) {
  TinyModelOptions o;
  o.shards = 2;
  const std::string dir = make_model(o);
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string shard = "model-00002-of-00002.safetensors";
  // A copy outside the model directory: loading it would succeed if the path were followed.
  const std::string outside = fs::path(dir).parent_path() / (fs::path(dir).filename().string() + "-outside");
  fs::create_directories(outside);
  fs::copy_file(dir + "/" + shard, outside + "/" + shard, fs::copy_options::overwrite_existing);
  json original;
  {
    std::ifstream in(index);
    original = json::parse(in);
  }
  const std::string escaping[] = {"../" + fs::path(outside).filename().string() + "/" + shard, outside + "/" + shard,
                                  "sub/../../" + fs::path(outside).filename().string() + "/" + shard};
  for (const std::string& path : escaping) {
    edit_json(index, [&](json& j) {
      j = original;
      for (auto& [name, file] : j["weight_map"].items())
        if (file == shard) file = path;
    });
    expect_load_error(dir, {"model.safetensors.index.json", path, "not a file inside the model directory"});
  }
  edit_json(index, [&](json& j) { j = original; });
  EXPECT_TRUE(Model::load(dir).ok());
}

// get<int> narrowed silently: 2^32 + 4 layers read as 4, head_dim 32.7 as 32.
TEST(LoaderErrors, IntegerFieldsMustBeIntegersInRange) {
  const std::string dir = make_model(TinyModelOptions{});
  const auto with = config_editor(dir);
  with([](json& c) { c["text_config"]["num_hidden_layers"] = (int64_t(1) << 32) + 4; });
  expect_load_error(dir, {"text_config.num_hidden_layers = 4294967300 is out of range"});
  with([](json& c) { c["text_config"]["head_dim"] = 32.7; });
  expect_load_error(dir, {"text_config.head_dim = 32.7 is not an integer"});
  with([](json& c) { c["text_config"]["bos_token_id"] = 1.5; });
  expect_load_error(dir, {"text_config.bos_token_id = 1.5 is not an integer"});
  with([](json& c) { c["text_config"]["num_experts"] = 1e300; });
  expect_load_error(dir, {"text_config.num_experts", "out of range"});
  with([](json& c) { c["text_config"]["num_hidden_layers"] = true; });
  expect_load_error(dir, {"text_config.num_hidden_layers has the wrong type (true)"});
  with([](json& c) { c["text_config"]["head_dim"] = 32.0; });  // an integer written as a float
  auto m = Model::load(dir);
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_EQ((*m)->config().head_dim, 32);
}

// With tie_word_embeddings the lm_head is the embedding matrix, read whole per token: the
// active-parameter count subtracted (V - 1) rows of it anyway.
TEST(LoaderErrors, TiedLmHeadCountsAsActive) {
  const std::string untied = make_model(TinyModelOptions{}, "-untied");
  const std::string tied = make_model(TinyModelOptions{}, "-tied");
  edit_json(tied + "/config.json", [](json& c) { c["tie_word_embeddings"] = c["text_config"]["tie_word_embeddings"] = true; });
  edit_header(tied + "/model.safetensors", [](json& h) { h.erase("lm_head.weight"); });
  auto a = Model::load(untied), b = Model::load(tied);
  ASSERT_TRUE(a.ok()) << a.error();
  ASSERT_TRUE(b.ok()) << b.error();
  const ModelWeights &u = (*a)->weights(), &t = (*b)->weights();
  const int64_t V = (*a)->config().vocab_size, H = (*a)->config().hidden_size;
  EXPECT_EQ(t.n_params, u.n_params - V * H);  // the head is the embedding: counted once
  // Per token the untied model reads its head and one embedding row; the tied one, the one matrix.
  EXPECT_EQ(t.n_params_active, u.n_params_active - H);
  EXPECT_EQ(t.n_bytes_active, u.n_bytes_active - H * 2);  // bf16
}

// Released checkpoints name <|endoftext|> in config.json and <|im_end|> (the end of a chat turn)
// only in generation_config.json: generation stopped only on the former and ran on past a turn.
TEST(LoaderErrors, GenerationConfigEosIdsAreAddedToTheStopIds) {
  const std::string dir = make_model(TinyModelOptions{});
  std::vector<int64_t> made;
  edit_json(dir + "/config.json", [&](json& c) {
    made = c["text_config"]["eos_token_id"].get<std::vector<int64_t>>();  // {im_end, endoftext}
    c["text_config"]["eos_token_id"] = made[1];
  });
  auto only_config = Model::load(dir);
  ASSERT_TRUE(only_config.ok()) << only_config.error();
  EXPECT_EQ((*only_config)->config().eos_token_ids, std::vector<int64_t>{made[1]});
  std::ofstream(dir + "/generation_config.json") << json{{"eos_token_id", {made[0], made[1]}}, {"do_sample", true}}.dump();
  auto m = Model::load(dir);
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_EQ((*m)->config().eos_token_ids, (std::vector<int64_t>{made[1], made[0]}));
  // Generation (what `kiln engine generate` does by default) stops on <|im_end|> now.
  auto s = (*m)->open_session();
  ASSERT_TRUE((*s)->append(std::vector<int32_t>{1, 2, 3}).ok());
  GenerateOptions g;
  g.max_tokens = 4;
  g.sampling.temperature = 0;
  auto probe = (*s)->generate(g);
  ASSERT_TRUE(probe.ok()) << probe.error();
  std::ofstream(dir + "/generation_config.json", std::ios::trunc) << json{{"eos_token_id", probe->tokens[0]}}.dump();
  auto m2 = Model::load(dir);
  ASSERT_TRUE(m2.ok()) << m2.error();
  auto s2 = (*m2)->open_session();
  ASSERT_TRUE((*s2)->append(std::vector<int32_t>{1, 2, 3}).ok());
  for (int64_t e : (*m2)->config().eos_token_ids) g.stop.push_back(int32_t(e));
  auto r = (*s2)->generate(g);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->reason, GenerateResult::Reason::stop_token);
  EXPECT_EQ(r->tokens.size(), 1u);
  std::ofstream(dir + "/generation_config.json", std::ios::trunc) << R"({"eos_token_id": "<|im_end|>"})";
  expect_load_error(dir, {"generation_config.json: eos_token_id", "expected a token id"});
}

}  // namespace
}  // namespace kiln::engine
