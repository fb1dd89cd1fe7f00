"""What a user's reply says about the answer's *style*, negation included.

The offline judge (offline.py) turns a style demand into the instruction the
tiny model was trained on, for the on-policy-distillation teacher. A demand can
ask for a style ("in capitals please") or refuse one ("no capitals", "stop
shouting", "don't explain"); reading a refusal as a request would tell the
teacher to do exactly what the user refused, so `read_style_demand` finds
every style cue, decides per cue whether it is asked for or refused, and
resolves:

    asked                          -> that style ("lowercase, not uppercase" -> lower)
    nothing asked, one refusal     -> the style the refusal implies, when it is
                                      unambiguous ("no capitals" -> lower,
                                      "don't explain" / "no sentence" -> bare),
                                      else no style ("no exclamation marks")
    two different styles asked     -> no style (the caller quotes the user)

Whether a cue is refused: a negator earlier in its clause (VADER's negation
words, which handle "n't", plus "no" right before the cue, "stop", "skip",
"drop", "less", "too many", "instead of", ... and a few de/fr/es/zh ones), or
a complaint about its presence ("why is it in capitals?"). A complaint about
its *absence* asks for it: "you forgot the exclamation mark", "it's not in
capitals", "where's the full sentence?". A cue that is the subject of a
description ("one word is too blunt") is neither.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
from vaderSentiment.vaderSentiment import negated as _vader_negated


@dataclass(frozen=True)
class _Cue:
    rx: re.Pattern[str]
    names: str | None
    """The style the cue is about (caps -> upper); None for form demands that are no style of ours."""
    asks: bool = True
    """Whether an un-negated mention asks for `names` ("in caps"); False: it is no demand ("good shout")."""
    implies: str | None = None
    """The style that refusing it implies, when unambiguous ("no capitals" -> lower)."""
    positive_if: re.Pattern[str] | None = None
    """When set, an un-negated mention counts only if the clause before it matches ("in a full" sentence)."""


def _cue(pattern: str, names: str | None, *, asks: bool = True, implies: str | None = None,
         positive_if: str | None = None) -> _Cue:
    return _Cue(re.compile(pattern, re.I), names, asks, implies, re.compile(positive_if, re.I) if positive_if else None)


_EVERY_LETTER = r"\b(?:every|each|all)\b[\w ]{0,15}\bletters?\b[\w ]{0,12}\b"
# Earlier cues claim their span first: "start with a capital letter" is not all caps.
_CUES: tuple[_Cue, ...] = (
    _cue(r"\b(?:start|begin)s? with an? capital(?: letter)?\b|\bcapitali[sz]\w*|\bfirst letter\b", None),
    _cue(_EVERY_LETTER + r"(?:capitals?|caps|upper[- ]?case)\b|\bcapital letters?\b|\bcapitals\b(?! of\b)|"
         r"\bcaps\b(?: lock\b)?|\bupper[- ]?case\b|\bblock (?:letters|capitals)\b|\bgroßbuchstaben\b|"
         r"\bmajuscules?\b|\bmayúsculas?\b|大写", "upper", implies="lower"),
    _cue(r"\bshout\w*|\byell\w*|\bscream\w*", None, asks=False),
    _cue(_EVERY_LETTER + r"(?:small|lower[- ]?case)\b|\blower[- ]?case\b|\bsmall letters\b|\bkleinbuchstaben\b|"
         r"\bminuscules?\b|\bminúsculas?\b|小写", "lower"),
    _cue(r"\b(?:just|only)(?: (?:give|want|need|send|say|write|tell))?(?: me)?(?: the| a| one)? "
         r"(?:number|answer|digits?|result|value|word)s?\b|"
         r"\b(?:number|answer|digits?|result|value)s? (?:only|alone|by itself)\b|\bnothing else\b|\bone word\b|"
         r"\bsingle (?:number|word|value)\b|\bbare (?:number|value|answer|result)s?\b|"
         r"\bnur die (?:zahl|antwort)\b|\b(?:seulement|juste) le (?:nombre|chiffre)\b|"
         r"\bsolo el (?:número|resultado)\b|只回答数字|只要数字|只回答答案", "bare"),
    _cue(r"\bsentences?\b", "sentence", implies="bare",
         positive_if=r"(?:\b(?:full|complete|whole|proper|real)|\b(?:in|as|into|with|using|use|like)(?: an?| one)?"
                     r"(?: full| complete| whole| proper| real)?)\s*$"),
    _cue(r"\bganzen satz\b|\bphrase complète\b|\bfrase completa\b|完整的句子", "sentence", implies="bare"),
    _cue(r"\bexplain\w*|\bexplanations?\b|\bfiller\b|\bfluff\b|\bwaffle\b|\bpreamble\b|'the answer is'",
         None, asks=False, implies="bare"),
    _cue(r"\bexclamation(?: marks?| points?)?\b|\bausrufezeichen\b|\bpoint d'exclamation\b|"
         r"\bsigno de exclamación\b|感叹号|['\"]!['\"]|\b(?:a|an|the|one)\s+!(?=\s|$)|\b(?:a|the) bang\b",
         "exclaim"),
    _cue(r"\bexcit\w*|\benthusias\w*|\bthrill\w*|\benergetic\b|\bpeppy\b", "exclaim",
         positive_if=r"\b(?:more|some|with|sound|be|get|add|bit of)\b"),
)

# Negators VADER's list lacks: verbs of stopping or removing, comparatives of less, a few other languages.
_STOPPERS = frozenset("""stop stopping quit drop lose skip remove ditch cut less fewer enough avoid minus rid omit
delete strip eliminate kein keine keinen keiner nicht ohne pas sans sin nunca jamais niemals senza""".split())
_NEGATING_PAIRS = frozenset({("instead", "of"), ("rather", "than"), ("leave", "out"), ("take", "out")})
# After these, a leading "no" is an interjection ("no I want caps", "no just the number").
_NO_BLOCKERS = frozenset("""i i'm you it it's that just only in use write give say put make please want said meant
do redo try answer reply""".split())
_NO_REACH = 4  # "no" negates a cue at most this many words on: "no need for a whole sentence"
_CJK_NEGATOR = re.compile(r"(?:不要|别|不用|不|没有|无)\s*$")
_CLAUSE_END = re.compile(r"[,;.!?:()\n]|\s[-–—]\s|\bbut\b|\baber\b|\bmais\b|\bpero\b|但是|，|。|！|？")
_TOKEN = re.compile(r"[\w']+")
# "and" / "then" end a negation's reach unless the cue follows at once: "drop the fluff and send the digits
# only", "no capitals and just the number" (two demands); "without capitals and exclamation marks" (one).
_AND = re.compile(r"\b(?:and|then)\b|&")
_AND_CONTINUES = re.compile(r"^\s*(?:(?:a|an|the|any)\s+)?$")
_ABSENCE = re.compile(
    r"\byou (?:didn't|did not|forgot|missed|left out|never|haven't|have not|dropped|removed)\b|\bforgot\b|"
    r"\bmissing\b|\bwhere(?:'s| is| are| did| has)\b|\bwhy (?:no|not|didn't|did not|don't|do not|isn't|is not|"
    r"aren't|are not|wasn't)\b|\b(?:it|that|this|the answer|your answer|the reply)(?:'s| is| was)?(?: still)? not\b|"
    r"\b(?:isn't|wasn't|aren't|weren't|isnt|wasnt)\b|\bthere(?:'s| is| are| was)(?: still)? no\b|"
    r"\b(?:don't|do not) forget\b")
_PRESENCE = re.compile(r"\bwhy\b|\btoo (?:many|much)\b|\bso many\b|\bwhat(?:'s| is) with\b|"
                       r"\bwho (?:asked|wants|needs|said)\b")
# "capitals? no thanks": a mention turned down by the next words.
_TURNED_DOWN = re.compile(r"^[\s'\"]*\?+\s*(?:no|nope|nah|ugh|yuck|pass|please don't|please no)\b")
_DISLIKE = -0.3
"""VADER's compound score of the words before a cue at or below which they refuse it ("I hate capitals")."""
_DESCRIBED = re.compile(r"^\s*(?:is|are|was|were|'s|looks?|seems?|feels?)\b")
_CONTENT = re.compile(r"\b(?:this|these|following|my)\s*$")  # "translate this sentence": content, not form


@dataclass(frozen=True)
class StyleDemand:
    style: str | None
    """The style to ask the teacher for (a key of the tiny model's STYLES), or None."""
    asked: tuple[str, ...]
    """Styles asked for, in order of mention."""
    refused: tuple[str, ...]
    """Styles refused ("no capitals" refuses upper)."""
    other: bool = False
    """A demand about form that names no style ("stop shouting", "don't explain", "start with a capital")."""

    @property
    def mentioned(self) -> bool:
        """Whether the reply makes any demand about the answer's form."""
        return bool(self.asked or self.refused or self.other)


def _refuses(prefix: str, focus: bool) -> bool:
    """Whether the clause text before a cue negates it (`focus`: the cue starts with "just"/"only")."""
    if _CJK_NEGATOR.search(prefix):
        return True
    words = _TOKEN.findall(prefix)
    if _vader_negated(words) or any(w in _STOPPERS for w in words):
        return True
    if any((a, b) in _NEGATING_PAIRS for a, b in zip(words, words[1:])):
        return True
    # "no" negates what follows it closely ("no capitals", "no more caps", "no need to shout"); elsewhere, and
    # before "just"/"only", it is an interjection ("no I want caps", "no just the number").
    return not focus and any(w == "no" and len(words) - i - 1 <= _NO_REACH and not _NO_BLOCKERS & set(words[i + 1:])
                             for i, w in enumerate(words))


@functools.lru_cache(maxsize=1)
def _analyzer() -> SentimentIntensityAnalyzer:
    return SentimentIntensityAnalyzer()  # reads the lexicon shipped in the wheel; no network


def sentiment(text: str) -> float:
    """VADER's compound score of `text` in [-1, 1]; its lexicon handles negation ("not great") and intensity."""
    return _analyzer().polarity_scores(text)["compound"]


def valence(word: str) -> float:
    """A word's valence in VADER's lexicon (-4..4), 0 for a word it does not list."""
    return _analyzer().lexicon.get(word.lower(), 0.0)


def _dislikes(prefix: str) -> bool:
    """Whether the words before a cue dislike it ("I hate capitals"); a "no" there is `_refuses`' to judge."""
    words = [w for w in _TOKEN.findall(prefix) if w not in ("no", "nope", "nah")]
    return bool(words) and sentiment(" ".join(words)) <= _DISLIKE


def _clause_before(low: str, pos: int, focus: bool) -> str:
    """The text of the clause before `pos`; `focus`: the cue starts with "just"/"only", which a preceding
    "and" always separates from what came before."""
    ends = list(_CLAUSE_END.finditer(low, 0, pos))
    start = ends[-1].end() if ends else 0
    for m in _AND.finditer(low, start, pos):
        if focus or not _AND_CONTINUES.match(low[m.end():pos]):
            start = m.end()
    return low[start:pos]


def read_style_demand(text: str) -> StyleDemand:
    """The style demands in `text` (see the module docstring)."""
    low = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    taken: list[tuple[int, int]] = []
    asked: list[str] = []
    refused: list[str] = []
    implied: list[str] = []
    other = False
    for cue in _CUES:
        for m in cue.rx.finditer(low):
            if any(m.start() < b and a < m.end() for a, b in taken):
                continue
            taken.append(m.span())
            focus = m.group().startswith(("just", "only"))
            prefix = _clause_before(low, m.start(), focus)
            if _DESCRIBED.match(low[m.end():]) or _CONTENT.search(prefix):
                continue  # "one word is too blunt", "translate this sentence": no demand
            if _ABSENCE.search(prefix):
                is_refused = False  # "you forgot the exclamation mark": asks for it
            else:
                is_refused = (_refuses(prefix, focus) or bool(_PRESENCE.search(prefix))
                              or bool(_TURNED_DOWN.match(low[m.end():])) or _dislikes(prefix))
            if is_refused:
                if cue.names:
                    refused.append(cue.names)
                else:
                    other = True
                if cue.implies:
                    implied.append(cue.implies)
            elif cue.asks and cue.names is None:
                other = True
            elif cue.asks and (cue.positive_if is None or cue.positive_if.search(prefix)):
                asked.append(cue.names)
    wanted = [s for s in dict.fromkeys(asked) if s not in refused]
    if wanted:
        style = wanted[0] if len(wanted) == 1 else None
    else:
        options = [s for s in dict.fromkeys(implied) if s not in refused]
        style = options[0] if len(options) == 1 else None
    return StyleDemand(style, tuple(asked), tuple(refused), other)
