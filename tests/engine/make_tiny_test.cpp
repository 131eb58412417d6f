// make_tiny writes the released layout: a config with text_config, real tensor names (packed or
// per-expert), a matching tokenizer whose ids the config's eos list uses, and weights that keep
// logits O(1).
#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_models.h"

namespace kiln::engine {
namespace {

using testing::make_model;

TEST(MakeTiny, WritesReleasedLayoutWithTokenizerAndEosIds) {
  TinyModelOptions o;
  o.vocab = 1024;
  const std::string dir = make_model(o);
  std::ifstream in(dir + "/config.json");
  const auto cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["model_type"], "qwen3_5_moe");
  ASSERT_TRUE(cfg.contains("text_config"));
  auto tok = Tokenizer::load_model_dir(dir);
  ASSERT_TRUE(tok.ok()) << tok.error;
  EXPECT_EQ(tok.tokenizer->vocab_size(), 1024u);
  const auto im_end = tok.tokenizer->token_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  auto m = Model::load(dir);
  ASSERT_TRUE(m.ok()) << m.error();
  ASSERT_FALSE((*m)->config().eos_token_ids.empty());
  EXPECT_EQ((*m)->config().eos_token_ids[0], *im_end);
  EXPECT_TRUE((*m)->weights().warnings.empty());
  auto s = (*m)->open_session();
  auto logits = (*s)->append(tok.tokenizer->encode("hello tiny world"));
  ASSERT_TRUE(logits.ok()) << logits.error();
  double ss = 0;
  for (float x : *logits) ss += double(x) * x;
  const double rms = std::sqrt(ss / double(logits->size()));
  EXPECT_GT(rms, 0.1);  // O(1) logits: neither vanishing nor exploding
  EXPECT_LT(rms, 10.0);
}

TEST(MakeTiny, PackedAndPerExpertLayoutsComputeTheSameModel) {
  TinyModelOptions o;
  o.seed = 11;
  auto packed = Model::load(make_model(o, ".packed"));
  o.per_expert = true;
  auto per = Model::load(make_model(o, ".per"));
  ASSERT_TRUE(packed.ok()) << packed.error();
  ASSERT_TRUE(per.ok()) << per.error();
  EXPECT_EQ((*packed)->weights().n_params, (*per)->weights().n_params);
  // Same seed, different tensor names: the expert weights differ, so only shapes are comparable;
  // both must run and give finite logits.
  for (auto* m : {packed->get(), per->get()}) {
    auto s = m->open_session();
    auto l = (*s)->append(std::vector<int32_t>{1, 2, 3, 4});
    ASSERT_TRUE(l.ok());
    for (float x : *l) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(MakeTiny, ConfigWithoutFfnSizesTakesThemFromTheTensors) {
  const std::string dir = make_model(TinyModelOptions{});
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9};
  std::vector<float> before;
  {
    auto m = Model::load(dir);
    ASSERT_TRUE(m.ok()) << m.error();
    auto s = (*m)->open_session();
    ASSERT_TRUE(s.ok());
    before = *(*s)->append(toks);
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  cfg["text_config"].erase("moe_intermediate_size");
  cfg["text_config"].erase("shared_expert_intermediate_size");
  std::ofstream(dir + "/config.json", std::ios::trunc) << cfg.dump();
  auto m = Model::load(dir);
  ASSERT_TRUE(m.ok()) << m.error();
  EXPECT_TRUE((*m)->weights().warnings.empty());  // the shared expert is bound, not left over
  EXPECT_TRUE((*m)->weights().layers[0].moe.has_shared_expert);
  auto s = (*m)->open_session();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*(*s)->append(toks), before);
}

}  // namespace
}  // namespace kiln::engine
