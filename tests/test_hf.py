"""Tests for posenc.hf.rope_from_transformers and posenc.mrope against transformers.

Golden values are FROZEN from Hugging Face transformers 5.23.0 (torch 2.13.0+cpu), by the
script described here, run once in a separate environment (transformers is not a dependency
of posenc, and these tests never import it).  For each tiny config below the script built the
model's own rotary-embedding module from the config, took its cos/sin at the stated position
ids for a float64 input, and applied the model's own ``apply_rotary_pos_emb`` to the
query ``q_for(seq, dim)`` (defined below): the frozen tensor is that rotated query,
``(1, 1, seq, dim)`` flattened.  Modules (all ``transformers.models.<family>.modeling_<family>``):

* ``LlamaRotaryEmbedding(LlamaConfig(...))``, ``llama3`` scaling;
* ``Gemma4TextRotaryEmbedding(Gemma4TextConfig(...))`` per layer type (default sliding,
  ``proportional`` full attention with ``global_head_dim``), Gemma 4's ``apply_rotary_pos_emb``;
* ``Gemma3RotaryEmbedding(Gemma3TextConfig(...))`` per layer type (default / linear);
* ``Phi3RotaryEmbedding(Phi3Config(...))``, ``longrope`` with ``partial_rotary_factor`` 0.5
  (the Phi-4-mini combination), past and within the training length;
* ``GPTNeoXRotaryEmbedding(GPTNeoXConfig(...))``, ``partial_rotary_factor`` 0.25;
* ``DeepseekV3RotaryEmbedding(DeepseekV3Config(...))``, ``yarn`` with ``mscale`` and
  ``mscale_all_dim`` (``rope_interleave=False``: ``apply_rotary_pos_emb``);
* ``Qwen2VLRotaryEmbedding(Qwen2VLTextConfig(...))``, ``mrope_section`` (contiguous);
* ``Qwen3VLTextRotaryEmbedding(Qwen3VLTextConfig(...))``, interleaved sections;
* ``Glm4vTextRotaryEmbedding(Glm4vTextConfig(...))``, sections over a partial rotary dim,
  interleaved pairs (``rotate_half_llm``).

Tolerance: transformers forms ``position * inv_freq`` and its cos/sin in float32, so its
angles carry float32 rounding, about ``|angle| * 6e-8`` (angles here stay below 50 rad):
each rotated feature is within ``HF_ATOL = 2e-5`` of the exact value (the largest gap seen
over every case is 1.5e-6, in the scaled cases at position 40).  The values are stored to 10
significant digits.  Every case differs from plain RoPE at the same positions by far
more (checked below), so a wrong band, factor, section or layout cannot pass.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import RopeScaling, RotaryEmbedding
from posenc.hf import rope_from_transformers
from posenc.mrope import MultimodalRotaryEmbedding, apply_mrope, mrope_axes, mrope_cos_sin

HF_ATOL = 2e-5


def _floats(text):
    return [float(v) for v in text.split()]


def q_for(seq, dim):
    """The query every frozen case rotates: ``sin(0.37 * n)`` over ``n = 0 .. seq * dim - 1``."""
    return torch.arange(seq * dim, dtype=torch.float64).reshape(1, 1, seq, dim).mul(0.37).sin()


POSITIONS = torch.tensor([[0, 1, 5, 17, 40]])
# (3, 1, 6) multimodal position ids: a text token, a 2 x 2 image patch block at t = 3
# (h, w in {3, 4}), then a token with three different positions
MPOSITIONS = torch.tensor([[[0, 3, 3, 3, 3, 7]], [[0, 3, 3, 4, 4, 8]], [[0, 3, 4, 3, 4, 9]]])

# ------------------------------------------------------------------ frozen from transformers

LLAMA3 = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.6280183127 -0.03546201564 0.3704591354 "
    "0.6814165007 0.8997133128 0.9968569822 0.959499153 0.7924623327 -0.01893564268 "
    "0.170371473 -0.1891689625 -0.5329139719 -0.8036069009 -0.9645479814 -0.9944326663 "
    "-0.8895238953 0.5674767649 -0.6007802067 0.002706048545 0.3781811268 0.687659856 "
    "0.9032724432 0.997628123 0.9576263324 0.8604771681 -0.1527040187 0.1677074299 "
    "-0.1932288106 -0.5370582879 -0.8069739819 -0.9660848058 -0.993629935 1.162468801 "
    "1.014053497 -0.4454848351 0.009622509306 0.3849187445 0.6929038384 0.9063266076 "
    "0.9981768323 0.5893011175 0.144092415 0.418811194 0.1614625476 -0.1992024855 "
    "-0.5424189072 -0.8108227438 -0.9677588605 -0.08131371987 1.156977166 -0.9555323492 "
    "-0.4107061746 0.01953843989 0.3902271527 0.6969197411 0.9087755386 -1.405519137 "
    "-0.5920410859 0.3501891107 0.4414753174 0.1548920241 -0.2078543687 -0.5492768823 "
    "-0.8152624327 "
)

GEMMA4_SLIDING_ATTENTION = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.6280183127 -0.04760003958 0.3854883675 "
    "0.6958994668 0.9067103277 0.9995220349 0.9603689289 0.7927084248 -0.01893564268 "
    "0.167386471 -0.156280493 -0.5138576325 -0.7957037351 -0.9617859718 -0.9935927392 "
    "-0.8893045782 0.5674767649 -0.5087524235 -0.06818724694 0.4012155236 0.7104906718 "
    "0.9143501178 1.00184515 0.9590000786 0.8604771681 -0.3541558273 0.1532436093 "
    "-0.1392280193 -0.5064688835 -0.7944004253 -0.9617109184 -0.9923040908 1.162468801 "
    "0.2118214979 -0.4581752818 -0.06460271483 0.4101903577 0.7176427913 0.9182869036 "
    "1.00271804 0.5893011175 1.002097232 -0.404888838 0.1482876869 -0.1399569737 "
    "-0.5092375334 -0.7972519485 -0.963052896 -0.08131371987 -0.9590199854 1.017572914 "
    "-0.5786006138 -0.03475825763 0.41079777 0.7157137004 0.917743005 -1.405519137 "
    "0.8771485401 -0.01482536717 -0.1697096852 0.152201025 -0.1634804468 -0.5245532798 "
    "-0.80515441 "
)

GEMMA4_FULL_ATTENTION = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.35525356 0.006814640075 0.3679605106 "
    "0.6793046521 0.8987080958 0.9964756147 0.9593748339 0.7924271699 0.5182282059 "
    "0.1738894854 -0.1939843613 -0.5356033346 -0.8047309093 -0.9649419305 -0.9945525882 "
    "-0.8895552187 0.3870503128 -0.04855690788 0.07399618496 0.3717050475 0.6842898458 "
    "0.9016757701 0.9970241088 0.9574299116 0.7882520674 0.5123880037 0.1671746275 "
    "-0.2006650504 -0.541345655 -0.8087576648 -0.9667081187 -0.9938191638 -1.037807538 "
    "-0.7441128902 -0.3346689173 0.04842657803 0.3805991098 0.6892432612 0.9046015706 "
    "0.9975263011 0.9554405264 0.7840403585 0.5065240063 0.160452006 -0.2073364206 "
    "-0.5470628353 -0.8127468617 -0.9684294131 -1.211945749 1.304563298 0.271354199 "
    "-0.07513895251 0.02725539568 0.3868920435 0.6941646683 0.9074853616 0.9979821685 "
    "0.9534067706 0.779792239 0.5006364859 0.1537219331 -0.2139981622 -0.5527546102 "
    "-0.8166983147 0.6770674573 -0.2504544042 -1.062270739 -0.7267460811 -0.3296440587 "
    "0.03406687126 0.39316701 0.6990538384 0.9103270091 0.9983916897 0.9513287388 "
    "0.7755079059 0.4947257161 0.1469847215 -0.2206499657 -0.5584207151 -0.3164844042 "
    "0.02352751803 1.099474042 0.6916266486 -0.6435381334 -0.3232026666 0.04087676479 "
    "0.3994237179 0.7039105445 0.9131263812 0.9987548458 0.9492065274 0.7711875585 "
    "0.4887919713 0.1402406838 -0.2272915223 0.9441430312 -1.274165756 0.8492784264 "
    "-1.12753055 -0.8734761923 -0.6383071692 -0.3167462651 0.04768476 0.4056618766 "
    "0.7087345612 0.9158833477 0.9990716198 0.947040235 0.7668313971 0.482835527 "
    "0.1334901334 0.06158112668 0.007026791314 -0.1345794573 1.082827812 -0.9894605054 "
    "-0.8701380878 -0.6330465621 -0.3102751539 0.05449054074 0.4118811964 0.7135256643 "
    "0.9185977808 0.9993419971 0.9448299622 0.7624396243 0.47685666 -0.2588220626 "
    "0.6183371549 -0.999468055 0.6857643068 -0.9763597535 -0.9884507499 -0.8667595743 "
    "-0.6277565564 -0.3037896336 0.06129379095 0.4180813885 0.7182836314 0.9212695544 "
    "0.9995659651 0.9425758116 0.7580124438 "
)

GEMMA3_SLIDING_ATTENTION = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.6280183127 -0.04760003958 0.3854883675 "
    "0.6958994668 0.9067103277 0.9995220349 0.9603689289 0.7927084248 -0.01893564268 "
    "0.167386471 -0.156280493 -0.5138576325 -0.7957037351 -0.9617859718 -0.9935927392 "
    "-0.8893045782 0.5674767649 -0.5087524235 -0.06818724694 0.4012155236 0.7104906718 "
    "0.9143501178 1.00184515 0.9590000786 0.8604771681 -0.3541558273 0.1532436093 "
    "-0.1392280193 -0.5064688835 -0.7944004253 -0.9617109184 -0.9923040908 1.162468801 "
    "0.2118214979 -0.4581752818 -0.06460271483 0.4101903577 0.7176427913 0.9182869036 "
    "1.00271804 0.5893011175 1.002097232 -0.404888838 0.1482876869 -0.1399569737 "
    "-0.5092375334 -0.7972519485 -0.963052896 -0.08131371987 -0.9590199854 1.017572914 "
    "-0.5786006138 -0.03475825763 0.41079777 0.7157137004 0.917743005 -1.405519137 "
    "0.8771485401 -0.01482536717 -0.1697096852 0.152201025 -0.1634804468 -0.5245532798 "
    "-0.80515441 "
)

GEMMA3_FULL_ATTENTION = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.4170917241 0.002947973721 0.368724426 "
    "0.67968098 0.8988086872 0.9964970639 0.9593787652 0.7924277952 0.4698936884 "
    "0.1739979907 -0.1925283586 -0.5351257056 -0.8046185707 -0.9649197804 -0.9945487959 "
    "-0.8895546617 -0.999813955 -0.4035535348 0.0103224378 0.3749914436 0.6846280645 "
    "0.9017656574 0.997043215 0.9574334045 0.2506447205 0.4705315128 0.1674113227 "
    "-0.1993483223 -0.540917877 -0.8086574503 -0.9666884133 -0.9938157987 -0.3459362323 "
    "-0.9018284853 -0.375719638 0.01852387829 0.3810388373 0.6894499466 0.9046561859 "
    "0.9975378736 -1.256557896 0.4855641693 0.4823839519 0.1606848276 -0.2065271785 "
    "-0.5468023485 -0.8126860739 -0.9684174929 0.6753015521 -1.29686514 -0.7685361807 "
    "-0.3500118888 0.02648644802 0.3870821563 0.6942520664 0.9075083248 1.235339601 "
    "-0.08514457677 0.6671030929 0.4909905538 0.1538562854 -0.2136540719 -0.5526448531 "
    "-0.8166727989 "
)

PHI3_LONG = _floats(
    "0 0.4428866618 0.8258306917 1.097002412 1.219700001 1.177316918 0.9755895124 "
    "0.6418206432 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -1.107267109 -0.0221639462 0.4493519578 "
    "0.831926393 0.4180690208 1.220255644 1.175489495 0.9705627464 0.5182282059 "
    "0.1738894854 -0.1939843613 -0.5356033346 -0.8047309093 -0.9649419305 -0.9945525882 "
    "-0.8895552187 1.13854935 -0.5616304815 0.009907889958 0.458114787 0.2602854175 "
    "1.042435158 1.221174043 1.172722019 0.7882520674 0.5123880037 0.1671746275 "
    "-0.2006650504 -0.541345655 -0.8087576648 -0.9667081187 -0.9938191638 -0.4339132664 "
    "-1.083421739 -0.4403024328 0.02399856949 -1.098916435 0.4362382564 1.09978601 "
    "1.221736072 0.9554405264 0.7840403585 0.5065240063 0.160452006 -0.2073364206 "
    "-0.5470628353 -0.8127468617 -0.9684294131 0.3817671812 -0.9831990021 -0.8378554266 "
    "-0.4138222712 -1.155231435 -0.6542435899 0.8137524933 1.11061272 0.9979821685 "
    "0.9534067706 0.779792239 0.5006364859 0.1537219331 -0.2139981622 -0.5527546102 "
    "-0.8166983147 "
)

PHI3_SHORT = _floats(
    "0 0.4428866618 0.8258306917 1.097002412 1.219700001 1.177316918 0.9755895124 "
    "0.6418206432 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -1.16128001 -0.0729739853 0.4447771836 "
    "0.8316513311 0.2285845912 1.218273319 1.177227976 0.9707983781 0.5182282059 "
    "0.1738894854 -0.1939843613 -0.5356033346 -0.8047309093 -0.9649419305 -0.9945525882 "
    "-0.8895552187 0.5729171271 -0.7650927498 -0.01383753692 0.4564529693 1.017747116 "
    "0.9037327459 1.221135823 1.173369832 0.7882520674 0.5123880037 0.1671746275 "
    "-0.2006650504 -0.541345655 -0.8087576648 -0.9667081187 -0.9938191638 0.7970560129 "
    "-1.14282677 -0.4688657106 0.02137178445 -0.8721237923 0.2409427982 1.087915619 "
    "1.221784907 0.9554405264 0.7840403585 0.5065240063 0.160452006 -0.2073364206 "
    "-0.5470628353 -0.8127468617 -0.9684294131 0.9022405804 -0.9831990021 -0.8623250646 "
    "-0.4171521969 -0.8162523292 -0.6542435899 0.7877754524 1.109366135 0.9979821685 "
    "0.9534067706 0.779792239 0.5006364859 0.1537219331 -0.2139981622 -0.5527546102 "
    "-0.8166983147 "
)

NEOX = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 -0.5015724113 2.136616128e-05 "
    "-0.1001256295 0.6793388265 0.8987080958 0.9964756147 0.9593748339 0.7924271699 "
    "0.5182282059 0.1738894854 -0.1939843613 -0.5356033346 -0.8047309093 -0.9649419305 "
    "-0.9945525882 -0.8895552187 -0.1753281476 -0.3671458169 0.6407458744 0.3563842506 "
    "0.6842898458 0.9016757701 0.9970241088 0.9574299116 0.7882520674 0.5123880037 "
    "0.1671746275 -0.2006650504 -0.541345655 -0.8087576648 -0.9667081187 -0.9938191638 "
    "-0.08534930265 -0.6530089311 0.946441451 -0.09135178159 0.3805991098 0.6892432612 "
    "0.9046015706 0.9975263011 0.9554405264 0.7840403585 0.5065240063 0.160452006 "
    "-0.2073364206 -0.5470628353 -0.8127468617 -0.9684294131 1.149532953 -0.6826520212 "
    "-0.3038092593 -0.6534934786 0.02725539568 0.3868920435 0.6941646683 0.9074853616 "
    "0.9979821685 0.9534067706 0.779792239 0.5006364859 0.1537219331 -0.2139981622 "
    "-0.5527546102 -0.8166983147 "
)

DEEPSEEK_YARN = _floats(
    "0 0.4179269182 0.7792893887 1.035178696 1.150961423 1.110966921 0.9206082583 "
    "0.6056495862 0.2087190839 -0.2164605673 -0.6123432961 -0.9253482325 -1.113111627 "
    "-1.150220584 -1.031652581 -0.7734552411 -0.7258145947 -0.0348752505 0.4328447162 "
    "0.7855764725 1.038889249 1.151736977 1.108799359 0.9158336588 -0.02188434677 "
    "0.1980753444 -0.2091736214 -0.6183877113 -0.9297855695 -1.115113593 -1.149398609 "
    "-1.028071316 0.6558453682 -0.713233162 -0.01812826051 0.4334867867 0.7916302479 "
    "1.042455909 1.152422375 1.106568235 0.9944724103 -0.06742276114 0.1929988742 "
    "-0.2302013074 -0.6246560179 -0.9342870264 -1.117101826 -1.148534954 1.343490762 "
    "1.097229924 -0.6559137678 0.02113174188 0.4408812214 0.7974226032 1.045867055 "
    "1.153013535 0.6810682309 -0.4442056769 0.2629426637 0.1857386971 -0.2377516887 "
    "-0.63118141 -0.9388650256 -1.119080258 -0.09397607001 -0.2087256813 -1.016560858 "
    "-0.4065032624 0.02972151641 0.4479194957 0.8028998109 1.049099189 -1.624389386 "
    "-1.487469344 -0.5915637753 0.566026985 0.1779659271 -0.2459071613 -0.638028085 "
    "-0.9435444704 "
)

QWEN2VL = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 0.2785659945 -0.1373398413 0.4088524108 "
    "0.7269856791 0.9224420225 1.005584878 0.9623541985 0.7932707454 -0.5631754198 "
    "0.1068726435 -0.07658057325 -0.4688470467 -0.7774116182 -0.9554452503 -0.9916700219 "
    "-0.8888030852 0.5462760016 -0.619699837 -0.03638323544 0.391613679 0.700219879 "
    "0.9118334387 1.000882968 0.9586862623 -0.8740899967 0.01508294682 0.1637356596 "
    "-0.1643078457 -0.520576458 -0.7972878794 -0.9627123116 -0.9926073303 0.7427188154 "
    "-1.021213762 -0.5126952835 3.765569249e-05 0.388585916 0.6944020604 0.9070357638 "
    "0.9984446177 -1.070970751 -0.07867447178 0.3331712553 0.1617490235 -0.1919506686 "
    "-0.5404995788 -0.8100294277 -0.9674826725 0.8422664969 -1.289500091 -0.9059565525 "
    "-0.3965424964 0.02108635658 0.3895679107 0.6963701366 0.908517709 -1.128132609 "
    "-0.162168015 0.4635915778 0.4542401077 0.1546888969 -0.2090873344 -0.5499735439 "
    "-0.8155497939 -1.329437543 -0.2043640786 -1.295564656 -0.8221937322 -0.3681256014 "
    "0.02987038178 0.395136921 0.7006402961 0.04895112431 -1.392662821 0.03150184298 "
    "0.5884492417 0.4668000197 0.1478946287 -0.21710258 -0.5564289123 "
)

QWEN3VL = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 0.2785659945 -0.1373398413 0.4088524108 "
    "0.7269856791 0.9224420225 1.005584878 0.9623541985 0.7932707454 -0.5631754198 "
    "0.1068726435 -0.07658057325 -0.4688470467 -0.7774116182 -0.9554452503 -0.9916700219 "
    "-0.8888030852 0.5462760016 -0.619699837 -0.05254776322 0.391613679 0.700219879 "
    "0.9118334387 0.9999197718 0.9583723317 -0.8740899967 0.01508294682 0.1592853948 "
    "-0.1643078457 -0.520576458 -0.7972878794 -0.9637127292 -0.9929104514 0.7427188154 "
    "-0.9461106621 -0.476872323 0.005151739562 0.388585916 0.6944020604 0.9070357638 "
    "0.998750505 -1.070970751 -0.3923541608 0.3826909305 0.1616669648 -0.1919506686 "
    "-0.5404995788 -0.8100294277 -0.9671668809 0.8422664969 -1.175128957 -0.9059565525 "
    "-0.3819822961 0.02108635658 0.3895679107 0.6958198265 0.908517709 -1.128132609 "
    "-0.5551403489 0.4635915778 0.4665506953 0.1546888969 -0.2090873344 -0.5506696482 "
    "-0.8155497939 -1.329437543 0.2388643322 -1.292237143 -0.803177398 -0.3681256014 "
    "0.02987038178 0.3947019156 0.700464292 0.04895112431 -1.387161922 -0.09799624105 "
    "0.6141507673 0.4668000197 0.1478946287 -0.2178924137 -0.5566504377 "
)

GLM4V = _floats(
    "0 0.361615432 0.6742879116 0.8956986857 0.9958808445 0.961275203 0.7965654722 "
    "0.5240443417 0.1805962679 -0.1872946635 -0.5298361409 -0.8006667822 -0.9631309306 "
    "-0.9952398258 -0.8926476794 -0.6692398573 0.3507366777 -0.05687982554 0.1507778527 "
    "0.757704306 0.8684139337 1.022984443 0.9569932671 0.7953017478 0.5182282059 "
    "0.1738894854 -0.1939843613 -0.5356033346 -0.8047309093 -0.9649419305 -0.9945525882 "
    "-0.8895552187 0.7067474021 0.251657459 -0.09758957218 0.3615991051 0.6476850731 "
    "0.9283188197 0.9931864359 0.9614103505 0.7882520674 0.5123880037 0.1671746275 "
    "-0.2006650504 -0.541345655 -0.8087576648 -0.9667081187 -0.9938191638 0.9705558264 "
    "0.5273634993 -0.3234062789 -0.1145393108 0.3597536615 0.7003493927 0.9016049522 "
    "1.000235643 0.9554405264 0.7840403585 0.5065240063 0.160452006 -0.2073364206 "
    "-0.5470628353 -0.8127468617 -0.9684294131 1.107745491 0.7342696723 -0.4714192501 "
    "-0.5641857197 0.01176203925 0.3876724959 0.690529192 0.9102547649 0.9979821685 "
    "0.9534067706 0.779792239 0.5006364859 0.1537219331 -0.2139981622 -0.5527546102 "
    "-0.8166983147 -0.07949367565 -1.385378755 -0.1477461736 -1.083276238 -0.3313717795 "
    "0.004301065179 0.3868596976 0.7025640023 0.9103270091 0.9983916897 0.9513287388 "
    "0.7755079059 0.4947257161 0.1469847215 -0.2206499657 -0.5584207151 "
)

# name -> (rope_parameters as the transformers config holds them, head_dim, keyword arguments
# of rope_from_transformers, layer type or None, position ids, frozen rotated query)
CASES = {
    # LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=512): head 16
    "llama (llama3)": (
        {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        },
        16, {"max_position_embeddings": 512}, None, POSITIONS, LLAMA3,
    ),
    # Gemma4TextConfig(head_dim=16, global_head_dim=32, layer_types=["sliding_attention",
    # "full_attention"]) with its default rope_parameters
    "gemma 4 sliding (default)": (
        {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional", "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        {"sliding_attention": 16, "full_attention": 32}, {}, "sliding_attention", POSITIONS,
        GEMMA4_SLIDING_ATTENTION,
    ),
    "gemma 4 full (proportional)": (
        {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional", "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        {"sliding_attention": 16, "full_attention": 32}, {}, "full_attention", POSITIONS,
        GEMMA4_FULL_ATTENTION,
    ),
    # Gemma3TextConfig(head_dim=16, layer_types=["sliding_attention", "full_attention"])
    "gemma 3 sliding (default)": (
        {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        16, {}, "sliding_attention", POSITIONS, GEMMA3_SLIDING_ATTENTION,
    ),
    "gemma 3 full (linear)": (
        {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        16, {}, "full_attention", POSITIONS, GEMMA3_FULL_ATTENTION,
    ),
    # Phi3Config(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5,
    # max_position_embeddings=64, original_max_position_embeddings=16): factor 64 / 16
    "phi 3 (longrope, partial) long": (
        {
            "rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [1.2, 4.0, 9.0, 20.0], "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16,
        },
        16, {"max_position_embeddings": 64}, None, POSITIONS, PHI3_LONG,
    ),
    "phi 3 (longrope, partial) short": (
        {
            "rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [1.2, 4.0, 9.0, 20.0], "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16,
        },
        16, {"max_position_embeddings": 64}, None, torch.tensor([[0, 1, 5, 9, 15]]), PHI3_SHORT,
    ),
    # GPTNeoXConfig(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.25)
    "gpt-neox (partial)": (
        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        16, {"max_position_embeddings": 512}, None, POSITIONS, NEOX,
    ),
    # DeepseekV3Config(qk_rope_head_dim=16, max_position_embeddings=2560,
    # rope_interleave=False); mscale_all_dim 0.5 (synthetic) makes the attention factor
    # (1 + 0.1 ln 40) / (1 + 0.05 ln 40), not 1
    "deepseek v3 (yarn)": (
        {
            "rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 0.5, "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        },
        16, {"max_position_embeddings": 2560}, None, POSITIONS, DEEPSEEK_YARN,
    ),
    # Qwen2VLTextConfig(hidden_size=64, num_attention_heads=4): head 16, 8 pairs = 2 + 3 + 3
    "qwen2-vl (mrope)": (
        {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        16, {}, None, MPOSITIONS, QWEN2VL,
    ),
    # Qwen3VLTextConfig(head_dim=16): interleaved sections
    "qwen3-vl (interleaved mrope)": (
        {
            "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
            "rope_theta": 10000.0,
        },
        16, {}, None, MPOSITIONS, QWEN3VL,
    ),
    # Glm4vTextConfig(hidden_size=64, num_attention_heads=4): rotary dim 8 = 2 * (1 + 1 + 2)
    "glm-4v (mrope, partial, interleaved pairs)": (
        {
            "rope_type": "default", "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5,
            "rope_theta": 10000.0,
        },
        16, {"layout": "interleaved"}, None, MPOSITIONS, GLM4V,
    ),
}  # fmt: skip


def _module(name):
    params, head_dim, kwargs, layer_type, positions, frozen = CASES[name]
    module = rope_from_transformers(params, head_dim, **kwargs)
    if layer_type is not None:
        module = module[layer_type]
    return module, positions, frozen


@pytest.mark.parametrize("name", list(CASES))
def test_rotation_matches_transformers(name):
    module, positions, frozen = _module(name)
    q = q_for(positions.shape[-1], module.dim)
    got = module(q, positions)
    want = torch.tensor(frozen, dtype=torch.float64).reshape(q.shape)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=HF_ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_frozen_cases_differ_from_plain_rope_far_beyond_the_tolerance(name):
    module, positions, frozen = _module(name)
    q = q_for(positions.shape[-1], module.dim)
    plain = posenc.apply_rope(q, positions[0], layout="half") if positions.dim() == 2 else None
    if plain is None:  # multimodal: plain RoPE at the temporal positions
        plain = posenc.apply_rope(q, positions[0, 0], layout="half")
    want = torch.tensor(frozen, dtype=torch.float64).reshape(q.shape)
    if name.startswith(("gemma 4 sliding", "gemma 3 sliding")):
        assert (plain - want).abs().max() <= HF_ATOL  # the default layers are plain RoPE
    else:
        assert (plain - want).abs().max() > 100 * HF_ATOL


def test_what_each_config_maps_to():
    gemma4 = rope_from_transformers(
        CASES["gemma 4 full (proportional)"][0], {"sliding_attention": 16, "full_attention": 32}
    )
    assert set(gemma4) == {"sliding_attention", "full_attention"}
    local, full = gemma4["sliding_attention"], gemma4["full_attention"]
    assert (local.dim, local.base, local.scaling) == (16, 10000.0, None)
    # proportional rotates the whole head: partial_rotary_factor is the scaling's fraction
    assert (full.dim, full.rotary_dim, full.base) == (32, 32, 1e6)
    assert full.scaling == RopeScaling.proportional(0.25)
    neox = rope_from_transformers(CASES["gpt-neox (partial)"][0], 16)
    assert (type(neox), neox.rotary_dim, neox.layout) == (RotaryEmbedding, 4, "half")
    glm = rope_from_transformers(CASES["glm-4v (mrope, partial, interleaved pairs)"][0], 16,
                                 layout="interleaved")  # fmt: skip
    assert isinstance(glm, MultimodalRotaryEmbedding)
    assert (glm.rotary_dim, glm.sections, glm.arrangement) == (8, (1, 1, 2), "contiguous")
    phi = rope_from_transformers(CASES["phi 3 (longrope, partial) long"][0], 16,
                                 max_position_embeddings=64)  # fmt: skip
    assert phi.scaling.factor == 4.0 and phi.rotary_dim == 8
    assert phi.scaling.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    # no rope_parameters at all: transformers' default theta, plain RoPE
    plain = rope_from_transformers(None, 8)
    assert (plain.base, plain.scaling, plain.rotary_dim) == (10000.0, None, 8)


def test_unknown_rope_type_lists_the_known_ones():
    known = "'default', 'linear', 'dynamic', 'yarn', 'llama3', 'longrope', 'proportional'"
    with pytest.raises(ValueError, match=f"known types {known}, 'su', got 'mrope'"):
        rope_from_transformers({"rope_type": "mrope", "mrope_section": [2, 3, 3]}, 16)
    with pytest.raises(ValueError, match=f"layer type 'full_attention': .*{known}"):
        rope_from_transformers(
            {"sliding_attention": {"rope_type": "default"}, "full_attention": {"type": "ntk"}},
            16,
        )


def test_refuses_what_it_cannot_reproduce():
    # an odd number of rotated features: transformers turns ceil(r/2) pairs over an odd r
    with pytest.raises(ValueError, match="int\\(head_dim \\* factor\\) = 5"):
        rope_from_transformers({"rope_theta": 1e4, "partial_rotary_factor": 0.3125}, 16)
    with pytest.raises(ValueError, match="partial_rotary_factor must be in \\(0, 1\\]"):
        rope_from_transformers({"partial_rotary_factor": 0.0}, 16)
    with pytest.raises(ValueError, match="sections must sum to rotary_dim // 2 = 8"):
        rope_from_transformers({"mrope_section": [2, 2, 2]}, 16)
    with pytest.raises(ValueError, match="mrope_section'\\]\\[1\\] must be a positive int"):
        rope_from_transformers({"mrope_section": [2, 0, 6]}, 16)
    with pytest.raises(ValueError, match="mixes layer types"):
        rope_from_transformers({"full_attention": {}, "rope_theta": 1e4}, 16)
    with pytest.raises(ValueError, match="head_dim has no entry for layer type 'full_attention'"):
        rope_from_transformers({"full_attention": {}}, {"sliding_attention": 16})
    with pytest.raises(ValueError, match="head_dim is a mapping by layer type"):
        rope_from_transformers({"rope_theta": 1e4}, {"full_attention": 16})
    with pytest.raises(ValueError, match="layout must be one of"):
        rope_from_transformers({}, 16, layout="neox")


# ------------------------------------------------------------------ multimodal RoPE (posenc.mrope)


def test_mrope_axes_follow_each_arrangement():
    # Qwen2-VL's released sections: 16 temporal, 24 height, 24 width pairs, in runs
    assert mrope_axes([16, 24, 24]) == (0,) * 16 + (1,) * 24 + (2,) * 24
    # Qwen3-VL's: t h w t h w ... for 3 * 20 pairs, then t for the last 4
    axes = mrope_axes([24, 20, 20], "interleaved")
    assert axes[:6] == (0, 1, 2, 0, 1, 2) and axes[60:] == (0, 0, 0, 0)
    assert [axes.count(a) for a in range(3)] == [24, 20, 20]
    # transformers' rule taken literally when a run overshoots: 8 pairs t h w t h w t h
    assert mrope_axes([2, 3, 3], "interleaved") == (0, 1, 2, 0, 1, 2, 0, 1)
    with pytest.raises(ValueError, match="needs 3 sections"):
        mrope_axes([2, 3, 3, 1], "interleaved")
    with pytest.raises(ValueError, match="arrangement must be one of"):
        mrope_axes([2, 3, 3], "axial")


@settings(max_examples=30, deadline=None)
@given(
    positions=st.lists(st.integers(-(2**20), 2**20), min_size=1, max_size=6),
    arrangement=st.sampled_from(["contiguous", "interleaved"]),
    layout=st.sampled_from(["half", "interleaved"]),
)
def test_mrope_on_a_text_token_is_1d_rope(positions, arrangement, layout):
    # three equal positions: every pair turns by the same position, as 1-D RoPE
    pos = torch.tensor(positions)
    x = q_for(len(positions), 16)
    got = apply_mrope(x, pos.expand(3, -1), [2, 3, 3], layout=layout, arrangement=arrangement)
    want = posenc.apply_rope(x, pos, layout=layout)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_mrope_scores_depend_on_position_differences_per_axis():
    # a 2 x 3 x 4 video block from posenc.grid_positions, placed at text offset 5
    grid = posenc.grid_positions(2, 3, 4).T + 5  # (3, 24): t, h, w of each patch
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 24, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 24, 16, generator=g, dtype=torch.float64)
    rope = MultimodalRotaryEmbedding(16, [2, 3, 3], base=100.0)
    scores = rope(q, grid) @ rope(k, grid).transpose(-1, -2)
    shift = torch.tensor([[7], [-3], [11]])  # a different shift on each axis
    moved = rope(q, grid + shift) @ rope(k, grid + shift).transpose(-1, -2)
    torch.testing.assert_close(moved, scores, rtol=0, atol=1e-12)
    # the same query and key positions with one axis changed change the scores
    other = grid.clone()
    other[1] = other[1].flip(0)
    assert (rope(q, other) @ rope(k, grid).transpose(-1, -2) - scores).abs().max() > 0.1


def test_mrope_cos_sin_pick_each_pairs_axis():
    pos = torch.tensor([[3], [50], [700]])  # (3, seq=1)
    cos, sin = mrope_cos_sin(pos, [1, 2, 1], base=100.0, dtype=torch.float64)
    omega = [100.0 ** (-2 * i / 8) for i in range(4)]
    angles = [3 * omega[0], 50 * omega[1], 50 * omega[2], 700 * omega[3]]
    torch.testing.assert_close(cos[0], torch.tensor([math.cos(a) for a in angles],
                               dtype=torch.float64), rtol=0, atol=1e-14)  # fmt: skip
    torch.testing.assert_close(sin[0], torch.tensor([math.sin(a) for a in angles],
                               dtype=torch.float64), rtol=0, atol=1e-14)  # fmt: skip


def test_mrope_refuses_bad_input():
    x = q_for(6, 16)
    with pytest.raises(ValueError, match="num_axes = len\\(sections\\) = 3"):
        apply_mrope(x, MPOSITIONS[:2], [2, 3, 3])
    with pytest.raises(ValueError, match="seq = x.shape\\[-2\\] = 6"):
        apply_mrope(x, MPOSITIONS[..., :5], [2, 3, 3])
    with pytest.raises(ValueError, match="batch = x.shape\\[0\\] or 1"):
        apply_mrope(x, MPOSITIONS.expand(3, 2, 6), [2, 3, 3])
    with pytest.raises(ValueError, match="sections must sum to rotary_dim // 2 = 8"):
        apply_mrope(x, MPOSITIONS, [2, 2, 3])
    with pytest.raises(TypeError, match="must hold integers"):
        apply_mrope(x, MPOSITIONS.double(), [2, 3, 3])
    with pytest.raises(ValueError, match="2\\*\\*31"):
        apply_mrope(x, MPOSITIONS * 2**31, [2, 3, 3])
    with pytest.raises(ValueError, match="sections\\[1\\] must be a positive int"):
        MultimodalRotaryEmbedding(16, [4, -1, 5])


def test_mrope_length_dependent_scaling_sees_the_largest_position():
    # equal axes past the training length: dynamic NTK and longrope as in 1-D RoPE, which
    # takes max(positions) + 1 as transformers does
    pos = torch.tensor([0, 3, 40, 90])
    x = q_for(4, 16)
    for scaling in (
        RopeScaling.dynamic_ntk(2.0, 16),
        RopeScaling.longrope([1.0, 1.5, 2.0, 2.5] * 2, [5.0, 6.0, 7.0, 8.0] * 2, 16, 4.0),
    ):
        got = apply_mrope(x, pos.expand(3, -1), [2, 3, 3], scaling=scaling)
        want = posenc.apply_rope(x, pos, layout="half", scaling=scaling)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        within = apply_mrope(x[..., :2, :], pos[:2].expand(3, -1), [2, 3, 3], scaling=scaling)
        assert (within - got[..., :2, :]).abs().max() > 1e-3  # the length changed the frequencies


def test_mrope_traces_and_runs_on_meta():
    rope = MultimodalRotaryEmbedding(
        16, [2, 3, 3], scaling=RopeScaling.dynamic_ntk(2.0, 16), arrangement="interleaved"
    )
    q = torch.randn(2, 3, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([[[0, 5, 9, 30, 31, 32]], [[0, 5, 8, 1, 2, 40]], [[0, 6, 9, 2, 3, 4]]])
    want = rope(q, pos)
    compiled = torch.compile(lambda x, p: rope(x, p), fullgraph=True)
    torch.testing.assert_close(compiled(q, pos), want, rtol=0, atol=1e-12)
    out = rope(q.to("meta"), pos.to("meta"))
    assert out.device.type == "meta" and out.shape == q.shape
