/* pretok_table.c - which regexes (and which per-name settings) each
 * tokenizer.ggml.pre name stands for: the facts of llama.cpp's pre-tokenizer
 * table (llama_vocab::impl::load maps names to types, llm_tokenizer_bpe maps
 * types to regex lists). pretok.c compiles and applies them.
 *
 * The regexes are written as llama.cpp's are, except that characters beyond
 * ASCII are spelled \x{...} (PCRE2), so the code points can be read here.
 * Those that name a Unicode class (\p{...}) run on the collapsed text, the
 * others on the text itself (see pretok.c): llama.cpp's rule too.
 */
#include <string.h>

#include "pretok_int.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* CJK unified ideographs, U+0800..U+4E00, Hangul syllables and beyond up to
 * the surrogates: one run each (the DeepSeek pre-tokenizers). */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

enum {
    SET_DIGITS_GPT2,
    SET_GPT2,
    SET_DEFAULT,
    SET_FALCON,
    SET_LLAMA3,
    SET_QWEN2,
    SET_QWEN35,
    SET_DEEPSEEK_LLM,
    SET_DEEPSEEK_CODER,
    SET_NEWLINES,
};

static const char *const set_regex[][QI_PRETOK_MAX_REGEX] = {
    [SET_DIGITS_GPT2] = {"\\p{N}", RE_GPT2},
    [SET_GPT2] = {RE_GPT2},
    [SET_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    /* as "default" with the backquote among the punctuation, and without
     * the number runs */
    [SET_FALCON] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"},
    [SET_LLAMA3] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    [SET_QWEN2] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    /* as qwen2, with combining marks kept with letters */
    [SET_QWEN35] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
                                    "\\s+"},
    /* line breaks apart; runs of cased letters (Latin, Greek, Cyrillic,
     * Armenian, Georgian, Cherokee, ... as listed), of ASCII and full-width
     * punctuation, trailing white space, CJK/Hangul runs, digit runs */
    [SET_DEEPSEEK_LLM] =
        {"[\\r\\n]",
         "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
         "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
         "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
         "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
         "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
         "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
         "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}"
         "\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
         "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
         "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
         "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
         "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
         "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
         "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
         "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
         "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
         "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
         "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
         "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
         "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
    [SET_DEEPSEEK_CODER] = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"},
    /* runs of line feeds and runs of anything else (SentencePiece-style BPE,
     * whose spaces are already U+2581) */
    [SET_NEWLINES] = {"[^\\n]+|[\\n]+"},
};

#define L3 (QI_PRETOK_IGNORE_MERGES | QI_PRETOK_ADD_BOS)
#define SPM_BPE (QI_PRETOK_ESCAPE_SPACES | QI_PRETOK_RAW_BYTES)

static const struct {
    const char *name;
    int set;
    unsigned flags;
} pre_names[] = {
    {"default", SET_DEFAULT, 0},
    {"smollm", SET_DIGITS_GPT2, 0},
    {"starcoder", SET_DIGITS_GPT2, 0},
    {"refact", SET_DIGITS_GPT2, 0},
    {"command-r", SET_DIGITS_GPT2, 0},
    {"codeshell", SET_DIGITS_GPT2, 0},
    {"exaone", SET_DIGITS_GPT2, 0},
    {"minerva-7b", SET_DIGITS_GPT2, 0},
    {"mellum2", SET_DIGITS_GPT2, 0},
    {"gpt-2", SET_GPT2, 0},
    {"phi-2", SET_GPT2, 0},
    {"jina-es", SET_GPT2, 0},
    {"jina-de", SET_GPT2, 0},
    {"gigachat", SET_GPT2, 0},
    {"jina-v2-es", SET_GPT2, 0},
    {"jina-v2-de", SET_GPT2, 0},
    {"a.x-4.0", SET_GPT2, 0},
    {"mellum", SET_GPT2, 0},
    {"modern-bert", SET_GPT2, 0},
    {"jina-v1-en", SET_GPT2, 0},
    {"jina-v2-code", SET_GPT2, 0},
    {"roberta-bpe", SET_GPT2, 0},
    {"mpt", SET_GPT2, 0},
    {"olmo", SET_GPT2, 0},
    {"jais", SET_GPT2, 0},
    {"exaone4", SET_GPT2, 0},
    {"trillion", SET_GPT2, 0},
    {"granite-docling", SET_GPT2, 0},
    {"falcon", SET_FALCON, 0},
    {"llama3", SET_LLAMA3, L3},
    {"llama-v3", SET_LLAMA3, L3},
    {"llama-bpe", SET_LLAMA3, L3},
    {"falcon3", SET_LLAMA3, L3},
    {"falcon-h1", SET_LLAMA3, L3},
    {"pixtral", SET_LLAMA3, L3},
    {"midm-2.0", SET_LLAMA3, L3},
    {"lfm2", SET_LLAMA3, L3},
    {"jina-v5-nano", SET_LLAMA3, L3},
    {"dbrx", SET_LLAMA3, 0},
    {"smaug-bpe", SET_LLAMA3, 0},
    {"chatglm-bpe", SET_LLAMA3, QI_PRETOK_NO_BOS},
    {"glm4", SET_LLAMA3, QI_PRETOK_NO_BOS | QI_PRETOK_IGNORE_MERGES},
    {"glm5", SET_LLAMA3, QI_PRETOK_NO_BOS | QI_PRETOK_IGNORE_MERGES},
    {"qwen2", SET_QWEN2, 0},
    {"deepseek-r1-qwen", SET_QWEN2, 0},
    {"kormo", SET_QWEN2, 0},
    {"f2llmv2", SET_QWEN2, 0},
    {"megrez", SET_QWEN2, 0},
    {"stablelm2", SET_QWEN2, 0},
    {"hunyuan", SET_QWEN2, 0},
    {"solar-open", SET_QWEN2, 0},
    {"grok-2", SET_QWEN2, 0},
    {"qwen35", SET_QWEN35, 0},
    {"deepseek-llm", SET_DEEPSEEK_LLM, 0},
    {"deepseek-coder", SET_DEEPSEEK_CODER, 0},
    {"gemma4", SET_NEWLINES, SPM_BPE | QI_PRETOK_NEWLINE_RUNS | QI_PRETOK_FORCE_BOS},
    {"granite-embed-multi-311m", SET_NEWLINES, SPM_BPE | QI_PRETOK_NEWLINE_RUNS | QI_PRETOK_FORCE_BOS},
    {"sarvam-moe", SET_NEWLINES, SPM_BPE},
};

bool qi_pretok_lookup(const char *name, size_t len, const char *const **regex, unsigned *flags) {
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, name, len) == 0) {
            *regex = set_regex[pre_names[i].set];
            *flags = pre_names[i].flags;
            return true;
        }
    return false;
}
