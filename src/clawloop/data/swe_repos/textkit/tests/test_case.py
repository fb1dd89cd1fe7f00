from textkit import camel_case, kebab_case, slugify, snake_case, split_words, title_case


def test_split_words_spaces_and_punctuation():
    assert split_words("hello, big  world") == ["hello", "big", "world"]


def test_split_words_camel():
    assert split_words("parseHttpResponse") == ["parse", "Http", "Response"]


def test_split_words_acronym():
    assert split_words("parseHTTPResponse") == ["parse", "HTTP", "Response"]


def test_split_words_trailing_acronym():
    assert split_words("loadURL") == ["load", "URL"]


def test_snake_case():
    assert snake_case("parseHTTPResponse") == "parse_http_response"
    assert snake_case("Hello World") == "hello_world"


def test_kebab_case():
    assert kebab_case("userId2 lastName") == "user-id2-last-name"


def test_camel_case():
    assert camel_case("hello big_world") == "helloBigWorld"
    assert camel_case("hello big_world", upper_first=True) == "HelloBigWorld"


def test_camel_case_single_word():
    assert camel_case("HELLO") == "hello"


def test_title_case_small_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_title_case_small_word_last():
    assert title_case("what it is for") == "What It Is For"


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents_and_separator():
    assert slugify("Crème Brûlée au Café", sep="_") == "creme_brulee_au_cafe"


def test_slugify_max_length_keeps_words():
    assert slugify("one two three four", max_length=9) == "one-two"
    assert slugify("one two three four", max_length=7) == "one-two"


def test_slugify_max_length_long_first_word():
    assert slugify("extraordinary claims", max_length=5) == "extra"


def test_slugify_fits():
    assert slugify("a b", max_length=3) == "a-b"
