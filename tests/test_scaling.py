"""Tests for posenc.scaling.

Three kinds of reference, none computed by the code under test:

* each scaling's published formula, written out here as a float64 loop (YaRN from
  wavelength ratios, not from the closed-form index the implementation uses);
* values frozen from Hugging Face transformers 5.23.0 (torch 2.13.0, CPU):
  ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu",
  seq_len=...)`` for the configurations named at each constant, run in a separate
  virtual environment (transformers is not a dependency of posenc).  transformers
  computes ``base ** (2i / dim)`` in float32, so its frequencies carry float32
  rounding: they are stored to 9 significant digits (a float32 round trip) and
  compared at ``HF_RTOL`` relative, a few float32 ulps; the attention factors are
  Python floats there and are compared at 1e-15;
* hypothesis invariants.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import RopeScaling


def _floats(text):
    return [float(v) for v in text.split()]


def unscaled(dim, base):
    return [base ** (-2 * i / dim) for i in range(dim // 2)]


def as_list(t):
    assert t.dtype == torch.float64
    return t.tolist()


def close(got, want, tol=1e-13):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= tol * abs(w), (g, w)


# float32 carries 2**-24 ~ 6e-8 relative rounding; transformers' float32 pow adds a few
# ulps (the largest gap seen over every case below is 3.2e-7).  Any formula slip (a
# band edge, a ramp end, the wrong factor list) moves a frequency by far more.
HF_RTOL = 1e-6

# ------------------------------------------------------------------ frozen from transformers
# Phi-3.5-mini-instruct's config.json rope_scaling (type "longrope"), copied from two
# public copies of that file that agree value for value; head_dim 3072 / 32 = 96,
# rope_theta 10000, original_max_position_embeddings 4096, max_position_embeddings 131072.
PHI35_SHORT_FACTOR = _floats(
    "1.0 1.0199999809265137 1.0299999713897705 1.0299999713897705 1.0499999523162842 "
    "1.0499999523162842 1.0499999523162842 1.0499999523162842 1.0499999523162842 "
    "1.0699999332427979 1.0999999046325684 1.1099998950958252 1.1599998474121094 "
    "1.1599998474121094 1.1699998378753662 1.2899998426437378 1.339999794960022 1.679999828338623 "
    "1.7899998426437378 1.8199998140335083 1.8499997854232788 1.8799997568130493 "
    "1.9099997282028198 1.9399996995925903 1.9899996519088745 2.0199997425079346 "
    "2.0199997425079346 2.0199997425079346 2.0199997425079346 2.0199997425079346 "
    "2.0199997425079346 2.0299997329711914 2.0299997329711914 2.0299997329711914 "
    "2.0299997329711914 2.0299997329711914 2.0299997329711914 2.0299997329711914 "
    "2.0299997329711914 2.0299997329711914 2.0799996852874756 2.0899996757507324 2.189999580383301 "
    "2.2199995517730713 2.5899994373321533 2.729999542236328 2.749999523162842 2.8399994373321533 "
)

PHI35_LONG_FACTOR = _floats(
    "1.0800000429153442 1.1100000143051147 1.1399999856948853 1.340000033378601 1.5899999141693115 "
    "1.600000023841858 1.6200000047683716 2.620000123977661 3.2300000190734863 3.2300000190734863 "
    "4.789999961853027 7.400000095367432 7.700000286102295 9.09000015258789 12.199999809265137 "
    "17.670000076293945 24.46000099182129 28.57000160217285 30.420001983642578 30.840002059936523 "
    "32.590003967285156 32.93000411987305 42.320003509521484 44.96000289916992 50.340003967285156 "
    "50.45000457763672 57.55000305175781 57.93000411987305 58.21000289916992 60.1400032043457 "
    "62.61000442504883 62.62000274658203 62.71000289916992 63.1400032043457 63.1400032043457 "
    "63.77000427246094 63.93000411987305 63.96000289916992 63.970001220703125 64.02999877929688 "
    "64.06999969482422 64.08000183105469 64.12000274658203 64.41000366210938 64.4800033569336 "
    "64.51000213623047 64.52999877929688 64.83999633789062 "
)

# meta-llama/Llama-3.1-8B: rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
# original_max_position_embeddings 8192, rope_theta 500000, head_dim 128 (LlamaConfig).
HF_LLAMA31_8B = _floats(
    "1 0.814617217 0.663601279 0.540580988 0.440366626 0.358730227 0.292227834 0.238053814 "
    "0.193922758 0.157972813 0.128687382 0.10483095 0.0853971019 0.0695659518 0.0566696189 "
    "0.0461640507 0.0376060307 0.0306345206 0.0249554086 0.0203291047 0.0165604409 0.0134904198 "
    "0.0109895291 0.00895225909 0.00729266508 0.00594073068 0.00483942125 0.00394227589 "
    "0.00321144611 0.00216657063 0.00137189368 0.00085675146 0.000524846022 0.00031269365 "
    "0.000178507791 9.55621217e-05 7.78465546e-05 6.34151438e-05 5.16590699e-05 4.20823671e-05 "
    "3.42810235e-05 2.79259093e-05 2.2748929e-05 1.85316694e-05 1.50962178e-05 1.22976389e-05 "
    "1.00178686e-05 8.1607277e-06 6.64786967e-06 5.41546933e-06 4.41153452e-06 3.59371188e-06 "
    "2.92749974e-06 2.38479174e-06 1.94269251e-06 1.58255079e-06 1.28917316e-06 1.05018262e-06 "
    "8.55496921e-07 6.96902532e-07 5.6770881e-07 4.6246538e-07 3.7673226e-07 3.06892588e-07 "
)

# Qwen/Qwen2.5-7B-Instruct with the model card's long-context rope_scaling
# {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}: rope_theta 1e6,
# head_dim 3584 / 28 = 128, max_position_embeddings 32768 (Qwen2Config).  Attention factor
# 1.138629436111989.
HF_QWEN25_7B_YARN = _floats(
    "1 0.805842221 0.649381638 0.523299158 0.421696514 0.339820832 0.273841977 0.220673397 "
    "0.177827939 0.143301263 0.115478203 0.0930572003 0.0749894157 0.0604296438 0.0486967526 "
    "0.0392418988 0.0316227786 0.0254829675 0.0205352511 0.0165481716 0.0133352149 0.0107460786 "
    "0.00865964312 0.00697830599 0.00537532149 0.0041317381 0.00316842273 0.00242342241 "
    "0.00184827659 0.00140511245 0.00106436096 0.000802959781 0.000602941145 0.000450323569 "
    "0.000334240554 0.000246258394 0.000179841154 0.00012993149 9.26230132e-05 6.4903943e-05 "
    "4.44569851e-05 3.58253164e-05 2.88695483e-05 2.32643015e-05 1.87473561e-05 1.51074091e-05 "
    "1.21741887e-05 9.81047469e-06 7.90569356e-06 6.37074163e-06 5.13381246e-06 4.13704265e-06 "
    "3.33380353e-06 2.68651957e-06 2.16491094e-06 1.74457659e-06 1.40585337e-06 1.13289593e-06 "
    "9.1293532e-07 7.35681795e-07 5.92843435e-07 4.7773824e-07 3.84981632e-07 3.10234441e-07 "
)

# deepseek-ai/DeepSeek-V3 config.json: yarn, factor 40, beta_fast 32, beta_slow 1, mscale 1,
# mscale_all_dim 1, original 4096, rope_theta 10000, qk_rope_head_dim 64,
# max_position_embeddings 163840 (DeepseekV3Config).  Attention factor 1.0.
HF_DEEPSEEK_V3 = _floats(
    "1 0.749894202 0.562341332 0.421696514 0.316227764 0.237137362 0.177827939 0.133352146 "
    "0.100000001 0.0749894157 0.0562341288 0.0390069261 0.0268793609 0.0183781441 0.012447956 "
    "0.0083345091 0.00550000044 0.00356199732 0.00224936521 0.00137051346 0.000790569407 "
    "0.000414990413 0.00017782794 3.3338034e-05 2.49999994e-05 1.87473543e-05 1.40585325e-05 "
    "1.05424124e-05 7.90569447e-06 5.92843435e-06 4.44569832e-06 3.33380353e-06 "
)

# openai gpt-oss: transformers' GptOssConfig() defaults, which carry the released models'
# rope settings: yarn, factor 32, beta_fast 32, beta_slow 1, truncate False, original 4096,
# rope_theta 150000, head_dim 64.  Attention factor 1.3465735902799727.
HF_GPT_OSS = _floats(
    "1 0.689044297 0.47478205 0.327145875 0.225418001 0.155322984 0.107024424 0.0737445652 "
    "0.0508132726 0.0317056961 0.0193349998 0.0115920492 0.00679495931 0.00386035908 0.00209379266 "
    "0.00105260219 0.000456483918 0.000129318694 3.83088118e-05 2.63964685e-05 1.8188337e-05 "
    "1.25325696e-05 8.63549576e-06 5.95023948e-06 4.09997847e-06 2.82506676e-06 1.94659629e-06 "
    "1.34129095e-06 9.24208962e-07 6.36820914e-07 4.38797855e-07 3.0235114e-07 "
)

# Synthetic (no published model has mscale != mscale_all_dim with these numbers): yarn,
# factor 16, original 4096, mscale 0.707, mscale_all_dim 1.0, beta_fast 24, beta_slow 2,
# rope_theta 10000, head_dim 128 (LlamaConfig).  Attention factor 0.9363975061530204.
HF_YARN_MSCALE_RATIO = _floats(
    "1 0.865964353 0.749894202 0.649381638 0.562341332 0.486967534 0.421696514 0.365174145 "
    "0.316227764 0.273841977 0.237137362 0.2053525 0.177827939 0.153992653 0.133352146 0.115478203 "
    "0.100000001 0.0865964293 0.0749894157 0.0649381652 0.0562341288 0.0486967526 0.0421696492 "
    "0.0347155668 0.0285021085 0.023330614 0.0190333929 0.0154689886 0.0125181517 0.010080439 "
    "0.00807131454 0.00641967636 0.00506578898 0.00395950815 0.00305877929 0.00232837512 "
    "0.0017388186 0.00126547471 0.000887782022 0.000588603143 0.000353675743 0.00017115123 "
    "0.000148210864 0.000128345317 0.000111142464 9.62454069e-05 8.33450904e-05 7.21738761e-05 "
    "6.2500003e-05 5.4122771e-05 4.68683866e-05 4.05863539e-05 3.51463314e-05 3.04354689e-05 "
    "2.63560305e-05 2.28233821e-05 1.97642366e-05 1.71151223e-05 1.48210866e-05 1.28345309e-05 "
    "1.11142463e-05 9.62454033e-06 8.3345094e-06 7.21738706e-06 "
)

# Phi-3.5-mini-instruct (lists above), Phi3Config; seq_len 4096 uses short_factor and 4097
# long_factor.  Attention factor 1.1902380714238083 for both.
HF_PHI35_MINI_AT_4096 = _floats(
    "1 0.809219778 0.661448658 0.545962453 0.442056119 0.364874959 0.301169306 0.248586401 "
    "0.205184266 0.16619435 0.133436307 0.10914664 0.0862069055 0.0711555406 0.0582301095 "
    "0.0435923561 0.0346387215 0.0228046887 0.0176663585 0.0143415229 0.0116455965 0.00945893396 "
    "0.00768481381 0.00624498958 0.00502512651 0.00408616057 0.00337273302 0.00278386823 "
    "0.00229781703 0.0018966269 0.00156548433 0.0012857921 0.00106129784 0.000875999802 "
    "0.00072305405 0.000596811587 0.00049261091 0.000406603183 0.00033561181 0.000277015468 "
    "0.000223153387 0.00018331036 0.000144396268 0.000117574695 8.31828074e-05 6.51384544e-05 "
    "5.33745369e-05 4.2659427e-05 "
)

HF_PHI35_MINI_AT_4097 = _floats(
    "0.92592591 0.743607283 0.5976246 0.419657677 0.291923851 0.239449158 0.195202321 0.0996243134 "
    "0.0667007565 0.055055093 0.0306429919 0.0163719933 0.012987013 0.00908035412 0.00558436196 "
    "0.00318246358 0.001897624 0.00134098239 0.001039539 0.000846354349 0.000661072379 "
    "0.000540017965 0.000346833403 0.000269467913 0.00019864917 0.000163608376 0.00011838261 "
    "9.70725523e-05 7.97386965e-05 6.37044577e-05 5.05075477e-05 4.16824914e-05 3.43555112e-05 "
    "2.81640714e-05 2.32467464e-05 1.89983894e-05 1.56421083e-05 1.29050077e-05 1.06501784e-05 "
    "8.78246647e-06 7.24456004e-06 5.97875487e-06 4.93181142e-06 4.05241053e-06 3.34124411e-06 "
    "2.75659499e-06 2.27460032e-06 1.86848786e-06 "
)

# Synthetic Llama shape: linear, factor 4, rope_theta 100000, head_dim 128 (LlamaConfig).
HF_LINEAR_4 = _floats(
    "0.25 0.208840638 0.174457639 0.145735383 0.121741883 0.101698607 0.084955208 0.070968397 "
    "0.0592843406 0.0495239198 0.0413704254 0.0345593058 0.0288695507 0.0241165403 0.0201460533 "
    "0.0168292597 0.0140585322 0.0117439711 0.0098104747 0.00819530245 0.00684604887 0.00571893295 "
    "0.00477738259 0.00399084622 0.00333380373 0.00278493459 0.00232643005 0.00194341259 "
    "0.00162345415 0.00135617272 0.00113289594 0.000946378859 0.000790569466 0.000660412072 "
    "0.000551683537 0.000460855721 0.000384981628 0.000321599218 0.000268651958 0.000224421776 "
    "0.000187473546 0.000156608396 0.000130824774 0.00010928612 9.12935284e-05 7.62631971e-05 "
    "6.3707419e-05 5.32187914e-05 4.44569851e-05 3.71377027e-05 3.10234427e-05 2.59158223e-05 "
    "2.1649108e-05 1.80848529e-05 1.51074091e-05 1.26201639e-05 1.05424133e-05 8.80673633e-06 "
    "7.35681806e-06 6.14561031e-06 5.13381246e-06 4.28859494e-06 3.58253169e-06 2.99271255e-06 "
)

# Synthetic Llama shape: dynamic, factor 2, rope_theta 10000, head_dim 128,
# max_position_embeddings 4096 (LlamaConfig), at seq_len 4096, 6000 and 16384.
HF_DYNAMIC_2_AT_4096 = _floats(
    "1 0.865964353 0.749894202 0.649381638 0.562341332 0.486967534 0.421696514 0.365174145 "
    "0.316227764 0.273841977 0.237137362 0.2053525 0.177827939 0.153992653 0.133352146 0.115478203 "
    "0.100000001 0.0865964293 0.0749894157 0.0649381652 0.0562341288 0.0486967526 0.0421696492 "
    "0.0365174115 0.0316227786 0.0273841955 0.0237137359 0.0205352511 0.0177827943 0.0153992651 "
    "0.0133352149 0.0115478197 0.00999999978 0.00865964312 0.00749894232 0.00649381662 "
    "0.00562341325 0.00486967526 0.00421696482 0.00365174143 0.00316227786 0.00273841969 "
    "0.00237137382 0.00205352507 0.00177827943 0.00153992651 0.00133352145 0.00115478202 "
    "0.00100000005 0.000865964335 0.000749894185 0.000649381662 0.000562341302 0.000486967503 "
    "0.000421696488 0.000365174114 0.000316227786 0.000273841957 0.000237137385 0.000205352495 "
    "0.00017782794 0.000153992645 0.00013335215 0.000115478193 "
)

HF_DYNAMIC_2_AT_6000 = _floats(
    "1 0.856975615 0.734407187 0.62936908 0.539353907 0.462213188 0.396105409 0.339452684 "
    "0.290902644 0.249296471 0.213641003 0.183085129 0.156899497 0.134459034 0.115228117 "
    "0.0987476856 0.0846243575 0.0725210086 0.0621487387 0.0532599464 0.0456424765 0.0391144902 "
    "0.0335201621 0.0287259631 0.0246174484 0.0210965537 0.0180792324 0.0154934609 0.0132775186 "
    "0.011378509 0.00975110475 0.00835645851 0.00716128107 0.00613704324 0.00525929639 "
    "0.00450708857 0.00386246527 0.00331003848 0.0028366223 0.00243091607 0.00208323589 "
    "0.00178528228 0.00152994343 0.00131112419 0.00112360134 0.000962899008 0.000825180905 "
    "0.000707159925 0.000606018817 0.000519343361 0.000445064565 0.000381409482 0.00032685863 "
    "0.000280109874 0.000240047331 0.000205714707 0.00017629248 0.000151078362 0.000129470471 "
    "0.000110953035 9.50840404e-05 8.14847081e-05 6.98304066e-05 5.98429579e-05 "
)

HF_DYNAMIC_2_AT_16384 = _floats(
    "1 0.839625776 0.704971373 0.591912091 0.496984661 0.417281121 0.350359976 0.294171244 "
    "0.24699375 0.207382321 0.174123526 0.146198586 0.122752108 0.103065833 0.0865367204 "
    "0.0726584569 0.0610059127 0.0512221344 0.0430074222 0.0361101404 0.0303190015 0.0254566148 "
    "0.0213740282 0.0179461855 0.0150680784 0.0126515469 0.0106225647 0.00891897827 0.0074886037 "
    "0.00628762459 0.00527925137 0.00443259533 0.00372172147 0.00312485313 0.00262370706 "
    "0.00220293202 0.0018496383 0.00155300403 0.00130394218 0.00109482335 0.000919241924 "
    "0.000771819206 0.000648039219 0.000544110429 0.000456849113 0.000383582315 0.000322065578 "
    "0.000270414545 0.000227046999 0.000190634528 0.000160061652 0.000134391885 0.000112838883 "
    "9.47424269e-05 7.95481756e-05 6.67907007e-05 5.60791923e-05 4.70855339e-05 3.95342249e-05 "
    "3.31939518e-05 2.78704974e-05 2.34007875e-05 1.96479032e-05 1.6496886e-05 "
)


def phi35_parameters():
    """Phi-3.5-mini-instruct's rope_scaling as its config.json spells it."""
    return {
        "type": "longrope",
        "short_factor": PHI35_SHORT_FACTOR,
        "long_factor": PHI35_LONG_FACTOR,
    }


# name: (rope_parameters as the model's config spells them, max_position_embeddings, dim,
#        {seq_len: frozen inv_freq}, frozen attention factor)
HF_CASES = {
    "Llama-3.1-8B": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
        131072,
        128,
        {None: HF_LLAMA31_8B},
        1.0,
    ),
    "Qwen2.5-7B-Instruct yarn": (
        {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "rope_theta": 1e6,
        },
        32768,
        128,
        {None: HF_QWEN25_7B_YARN},
        1.138629436111989,
    ),
    "DeepSeek-V3": (
        {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
            "rope_theta": 10000.0,
        },
        163840,
        64,
        {None: HF_DEEPSEEK_V3},
        1.0,
    ),
    "gpt-oss": (
        {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
            "rope_theta": 150000.0,
        },
        131072,
        64,
        {None: HF_GPT_OSS},
        1.3465735902799727,
    ),
    "yarn mscale ratio (synthetic)": (
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 4096,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "beta_fast": 24.0,
            "beta_slow": 2.0,
            "rope_theta": 10000.0,
        },
        65536,
        128,
        {None: HF_YARN_MSCALE_RATIO},
        0.9363975061530204,
    ),
    "Phi-3.5-mini-instruct": (
        {**phi35_parameters(), "original_max_position_embeddings": 4096, "rope_theta": 10000.0},
        131072,
        96,
        {None: HF_PHI35_MINI_AT_4096, 4096: HF_PHI35_MINI_AT_4096, 4097: HF_PHI35_MINI_AT_4097},
        1.1902380714238083,
    ),
    "linear (synthetic)": (
        {"type": "linear", "factor": 4.0, "rope_theta": 100000.0},
        16384,
        128,
        {None: HF_LINEAR_4},
        1.0,
    ),
    "dynamic (synthetic)": (
        {"type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        4096,
        128,
        {
            None: HF_DYNAMIC_2_AT_4096,
            4096: HF_DYNAMIC_2_AT_4096,
            6000: HF_DYNAMIC_2_AT_6000,
            16384: HF_DYNAMIC_2_AT_16384,
        },
        1.0,
    ),
}


@pytest.mark.parametrize("name", list(HF_CASES))
def test_from_transformers_reproduces_transformers(name):
    parameters, max_positions, dim, frozen, attention = HF_CASES[name]
    scaling = RopeScaling.from_transformers(parameters, max_position_embeddings=max_positions)
    assert scaling.attention_factor == pytest.approx(attention, rel=1e-15)
    for seq_len, want in frozen.items():
        assert len(want) == dim // 2
        got = posenc.rope_frequencies(
            dim, base=parameters["rope_theta"], scaling=scaling, seq_len=seq_len
        )
        close(as_list(got), want, tol=HF_RTOL)


def test_frozen_cases_are_far_apart_at_the_tolerance():
    # the comparison above could not pass by accident: every frozen list differs from plain
    # RoPE, and the variants of one model differ from each other, by far more than HF_RTOL
    def gap(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))

    for parameters, max_positions, dim, frozen, _ in HF_CASES.values():
        for seq_len, want in frozen.items():
            if parameters.get("type") == "dynamic" and (seq_len or 0) <= max_positions:
                continue  # dynamic NTK is plain RoPE up to the training length
            assert gap(unscaled(dim, parameters["rope_theta"]), want) > 1000 * HF_RTOL
    assert gap(HF_PHI35_MINI_AT_4096, HF_PHI35_MINI_AT_4097) > 1000 * HF_RTOL
    assert gap(HF_DYNAMIC_2_AT_6000, HF_DYNAMIC_2_AT_16384) > 1000 * HF_RTOL
    # gpt-oss's truncate=False moves the ramp ends off integers
    truncated = RopeScaling.yarn(32.0, 4096)  # same numbers, truncate=True
    assert gap(as_list(truncated.frequencies(64, 150000.0)), HF_GPT_OSS) > 1000 * HF_RTOL


def test_phi3_config_json_keeps_the_training_length_outside_rope_scaling():
    # Phi-3's config.json has original_max_position_embeddings next to rope_scaling, and no
    # factor: factor = max_position_embeddings / original = 131072 / 4096 = 32
    scaling = RopeScaling.from_transformers(
        phi35_parameters(), max_position_embeddings=131072, original_max_position_embeddings=4096
    )
    assert scaling == RopeScaling.from_transformers(
        {**phi35_parameters(), "original_max_position_embeddings": 4096},
        max_position_embeddings=131072,
    )
    assert (scaling.kind, scaling.factor, scaling.original_max_positions) == (
        "longrope",
        32.0,
        4096,
    )
    # ln 32 / ln 4096 = 5 ln 2 / (12 ln 2): the attention factor is sqrt(17 / 12)
    assert scaling.attention_factor == pytest.approx(math.sqrt(17 / 12), rel=1e-15)
    close(as_list(posenc.rope_frequencies(96, scaling=scaling)), HF_PHI35_MINI_AT_4096, HF_RTOL)
    # the older "su" name of the same scaling
    assert scaling == RopeScaling.from_transformers(
        {**phi35_parameters(), "type": "su"},
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
    )


# ------------------------------------------------------------------ independent formulas


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
def test_linear_divides_every_frequency(factor):
    got = as_list(posenc.rope_frequencies(64, scaling=RopeScaling.linear(factor)))
    close(got, [w / factor for w in unscaled(64, 10000.0)])


@pytest.mark.parametrize("dim", [4, 64, 128])
def test_ntk_changes_the_base(dim):
    s, base = 4.0, 10000.0
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.ntk(s)))
    new_base = base * s ** (dim / (dim - 2))
    close(got, unscaled(dim, new_base))
    # bloc97's design: the highest frequency is kept, the lowest is interpolated by s
    assert got[0] == 1.0
    assert abs(got[-1] - unscaled(dim, base)[-1] / s) < 1e-12 * got[-1]


def test_dynamic_ntk_grows_with_length():
    s, orig, dim, base = 4.0, 2048, 64, 10000.0
    scaling = RopeScaling.dynamic_ntk(s, orig)
    for seq_len in (None, 10, orig):  # within the training length: nothing changes
        close(
            as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=seq_len)),
            unscaled(dim, base),
        )
    for seq_len in (4096, 3 * orig, 100_000):
        new_base = base * (s * seq_len / orig - (s - 1)) ** (dim / (dim - 2))
        got = as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=seq_len))
        close(got, unscaled(dim, new_base))
    # at seq_len = orig * (s + 1) / s the effective factor is 2: static NTK with factor 2
    close(
        as_list(posenc.rope_frequencies(dim, scaling=scaling, seq_len=orig * 5 // 4)),
        as_list(posenc.rope_frequencies(dim, scaling=RopeScaling.ntk(2.0))),
    )


def yarn_by_wavelength(dim, base, s, orig, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN frequencies from turn counts, dimension by dimension, in float64.

    Peng et al. (2023) sort frequency ``i`` by ``r_i = orig / lambda_i``, the turns its
    wavelength ``lambda_i = 2 pi base**(2i/dim)`` makes over the training context: more
    than ``beta_fast`` turns are kept, fewer than ``beta_slow`` are interpolated.  Their
    code (and transformers) ramps linearly in the *index* between the two boundary
    indices, rounded outwards (or not, ``truncate=False``), and clamps the upper one to
    ``dim - 1``.  Here the boundaries are found by scanning or bisecting ``r`` instead
    of inverting it with logarithms.
    """

    def turns(i):  # for any real index i, not only integers
        return orig / (2 * math.pi * base ** (2 * i / dim))

    if truncate:
        # floor(x) is the last integer whose turns are still >= beta (turns fall with i)
        low = 0
        while turns(low + 1) >= beta_fast and low + 1 <= dim - 1:
            low += 1
        high = 0
        while turns(high) > beta_slow and high < dim - 1:
            high += 1
    else:

        def crossing(beta):  # the real index where turns(i) == beta, by bisection
            lo, hi = -4.0 * dim, 4.0 * dim
            for _ in range(200):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if turns(mid) > beta else (lo, mid)
            return (lo + hi) / 2

        low = max(crossing(beta_fast), 0.0)
        high = min(crossing(beta_slow), dim - 1.0)
    if low == high:
        high += 0.001
    out = []
    for i in range(dim // 2):
        omega = base ** (-2 * i / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep, 1: divide by s
        out.append((1 - ramp) * omega + ramp * omega / s)
    return out


YARN_CASES = [
    (128, 10000.0, 4.0, 4096, 32.0, 1.0, True),
    (64, 500000.0, 16.0, 8192, 32.0, 1.0, True),
    (128, 1e6, 4.0, 32768, 32.0, 1.0, True),  # Qwen2.5
    (64, 150000.0, 32.0, 4096, 32.0, 1.0, False),  # gpt-oss
    (96, 10000.0, 8.0, 2048, 16.0, 2.0, False),
    # the slowest frequency still turns > beta_slow times: the ramp's upper end is clamped
    # to dim - 1 (not dim // 2 - 1, as the reference code does), so no frequency is fully
    # interpolated
    (64, 10000.0, 8.0, 10**6, 32.0, 1.0, True),
    (64, 10000.0, 8.0, 10**6, 32.0, 1.0, False),
]


@pytest.mark.parametrize("dim,base,s,orig,beta_fast,beta_slow,truncate", YARN_CASES)
def test_yarn_against_turn_counts(dim, base, s, orig, beta_fast, beta_slow, truncate):
    scaling = RopeScaling.yarn(s, orig, beta_fast, beta_slow, truncate=truncate)
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=scaling))
    want = yarn_by_wavelength(dim, base, s, orig, beta_fast, beta_slow, truncate)
    close(got, want, tol=1e-12)
    # the paper's bands, by turns r_i over the original context
    kept = interpolated = 0
    for g, w in zip(got, unscaled(dim, base), strict=True):
        r = orig * w / (2 * math.pi)
        if r >= beta_fast:
            assert g == pytest.approx(w, rel=1e-15)
            kept += 1
        elif r <= beta_slow:
            assert g == pytest.approx(w / s, rel=1e-15)
            interpolated += 1
        else:
            assert w / s <= g * (1 + 1e-15) and g <= w * (1 + 1e-15)
    assert kept and (interpolated or orig * unscaled(dim, base)[-1] / (2 * math.pi) > beta_slow)
    assert scaling.attention_factor == pytest.approx(0.1 * math.log(s) + 1, rel=1e-15)


def test_yarn_with_mscale_uses_the_ratio():
    s, m, m_all = 16.0, 0.707, 1.0
    scaling = RopeScaling.yarn(s, 4096, mscale=m, mscale_all_dim=m_all)
    want = (0.1 * m * math.log(s) + 1) / (0.1 * m_all * math.log(s) + 1)
    assert scaling.attention_factor == pytest.approx(want, rel=1e-15)
    assert RopeScaling.yarn(40, 4096, mscale=1.0, mscale_all_dim=1.0).attention_factor == 1.0


def test_llama3_bands():
    # Llama 3.1's published setting
    dim, base, s, orig, low, high = 128, 500000.0, 8.0, 8192, 1.0, 4.0
    got = as_list(posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.llama3(s, orig)))
    kept = scaled = blended = 0
    for g, w in zip(got, unscaled(dim, base), strict=True):
        wavelength = 2 * math.pi / w
        if wavelength < orig / high:
            assert g == w
            kept += 1
        elif wavelength > orig / low:
            assert abs(g - w / s) <= 1e-15 * w
            scaled += 1
        else:
            a = (orig / wavelength - low) / (high - low)
            assert abs(g - ((1 - a) * w / s + a * w)) <= 1e-14 * w
            assert w / s <= g <= w
            blended += 1
    assert kept and scaled and blended  # all three bands are exercised


def test_longrope_divides_by_the_list_for_the_length():
    short = [1.0 + 0.1 * i for i in range(8)]
    long = [2.0 + i for i in range(8)]
    scaling = RopeScaling.longrope(short, long, 1000, 8.0)
    omega = unscaled(16, 10000.0)
    for seq_len in (None, 0, 999, 1000):
        got = as_list(posenc.rope_frequencies(16, scaling=scaling, seq_len=seq_len))
        close(got, [w / f for w, f in zip(omega, short, strict=True)], tol=1e-15)
    for seq_len in (1001, 10**6):
        got = as_list(posenc.rope_frequencies(16, scaling=scaling, seq_len=seq_len))
        close(got, [w / f for w, f in zip(omega, long, strict=True)], tol=1e-15)
    assert scaling.attention_factor == pytest.approx(
        math.sqrt(1 + math.log(8.0) / math.log(1000)), rel=1e-15
    )
    assert RopeScaling.longrope(short, long, 1000, 1.0).attention_factor == 1.0


def test_attention_factor_is_one_except_yarn_and_longrope():
    for scaling in (
        RopeScaling.linear(4),
        RopeScaling.ntk(4),
        RopeScaling.dynamic_ntk(4, 100),
        RopeScaling.llama3(4, 100),
    ):
        assert scaling.attention_factor == 1.0
    assert RopeScaling.yarn(1.0, 100).attention_factor == 1.0
    assert RopeScaling.yarn(4.0, 100).attention_factor > 1.0


def test_depends_on_length():
    for scaling in (RopeScaling.dynamic_ntk(2, 100), RopeScaling.longrope([1.0], [2.0], 100, 4.0)):
        assert scaling.depends_on_length
        dim = 4 if scaling.kind == "dynamic_ntk" else 2
        # and indeed: past the training length the frequencies change
        assert not torch.equal(scaling.frequencies(dim), scaling.frequencies(dim, seq_len=10**6))
    for scaling in (
        RopeScaling.linear(2),
        RopeScaling.ntk(2),
        RopeScaling.yarn(2, 100),
        RopeScaling.llama3(2, 100),
    ):
        assert not scaling.depends_on_length
        # and indeed: the frequencies ignore seq_len
        assert torch.equal(scaling.frequencies(16), scaling.frequencies(16, seq_len=10**6))


def test_factor_one_is_identity():
    base = unscaled(32, 10000.0)
    for scaling in (
        RopeScaling.linear(1),
        RopeScaling.ntk(1),
        RopeScaling.yarn(1, 128),
        RopeScaling.yarn(1, 128, truncate=False),
        RopeScaling.llama3(1, 128),
    ):
        close(as_list(posenc.rope_frequencies(32, scaling=scaling)), base)
    # dynamic NTK with factor 1 is plain RoPE only up to the training length: past it the
    # effective factor 1 * L / orig - 0 still grows, in transformers as here
    dynamic = RopeScaling.dynamic_ntk(1, 128)
    close(as_list(dynamic.frequencies(32, seq_len=128)), base)
    close(
        as_list(dynamic.frequencies(32, seq_len=1280)), as_list(RopeScaling.ntk(10).frequencies(32))
    )


# ------------------------------------------------------------------ invariants

KIND_STRATEGY = st.sampled_from(["linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope"])


@st.composite
def scalings(draw):
    kind = draw(KIND_STRATEGY)
    factor = draw(st.floats(1.0, 64.0))
    orig = draw(st.integers(16, 10**6))
    dim = draw(st.integers(2, 128).map(lambda h: 2 * h))
    if kind == "linear":
        return RopeScaling.linear(factor), dim
    if kind == "ntk":
        return RopeScaling.ntk(factor), dim
    if kind == "dynamic_ntk":
        return RopeScaling.dynamic_ntk(factor, orig), dim
    if kind == "yarn":
        slow = draw(st.floats(0.5, 4.0))
        fast = draw(st.floats(slow + 1.0, 64.0))
        return RopeScaling.yarn(factor, orig, fast, slow, truncate=draw(st.booleans())), dim
    if kind == "llama3":
        low = draw(st.floats(0.5, 4.0))
        high = draw(st.floats(low + 0.5, 16.0))
        return RopeScaling.llama3(factor, orig, low, high), dim
    # non-decreasing divisors >= 1, as LongRoPE's searched lists are
    steps = st.lists(st.floats(0.0, 3.0), min_size=dim // 2, max_size=dim // 2)
    short = [1.0 + sum(draw(steps)[: i + 1]) * 0 for i in range(dim // 2)]
    short = [1.0 + t for t in _cumsum(draw(steps))]
    long = [1.0 + t for t in _cumsum(draw(steps))]
    return RopeScaling.longrope(short, long, orig, factor), dim


def _cumsum(values):
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out


@given(scalings(), st.floats(2.0, 1e7), st.one_of(st.none(), st.integers(0, 10**7)))
def test_frequencies_are_positive_and_non_increasing(scaling_dim, base, seq_len):
    scaling, dim = scaling_dim
    if scaling.kind in ("ntk", "dynamic_ntk") and dim < 4:
        dim = 4
    got = scaling.frequencies(dim, base, seq_len)
    assert got.shape == (dim // 2,) and got.dtype == torch.float64
    assert bool((got > 0).all()) and bool(torch.isfinite(got).all())
    assert bool((got[1:] <= got[:-1] * (1 + 1e-12)).all())
    # every scaling slows frequencies down, never speeds them up, and by at most `factor`
    # (LongRoPE by at most its largest divisor)
    omega = posenc.rope_frequencies(dim, base=base)
    assert bool((got <= omega * (1 + 1e-12)).all())
    if scaling.kind == "longrope":
        slowest = max(max(scaling.short_factor), max(scaling.long_factor))
    elif scaling.kind == "dynamic_ntk":
        length = max(seq_len or 0, scaling.original_max_positions)
        slowest = scaling.factor * length / scaling.original_max_positions
    else:
        slowest = scaling.factor
    assert bool((got >= omega / slowest * (1 - 1e-12)).all())


@given(st.floats(1.0, 1e3), st.integers(1, 128), st.floats(2.0, 1e7))
def test_linear_is_exact_division(factor, half, base):
    dim = 2 * half
    got = RopeScaling.linear(factor).frequencies(dim, base)
    assert torch.equal(got, posenc.rope_frequencies(dim, base=base) / factor)


@given(
    st.sampled_from(["linear", "ntk", "dynamic_ntk", "yarn", "llama3"]),
    st.integers(16, 10**6),
    st.integers(2, 64),
    st.floats(2.0, 1e7),
    st.booleans(),
)
def test_factor_one_leaves_frequencies_alone(kind, orig, half, base, long):
    dim = 2 * half
    if kind in ("linear", "ntk"):
        scaling = RopeScaling(kind, 1.0)
    else:
        scaling = RopeScaling(kind, 1.0, orig)
    # dynamic NTK grows past the training length even at factor 1 (see above)
    seq_len = orig if kind == "dynamic_ntk" or not long else 10 * orig
    got = scaling.frequencies(dim, base, seq_len=seq_len)
    close(got.tolist(), posenc.rope_frequencies(dim, base=base).tolist(), tol=1e-12)


# ------------------------------------------------------------------ validation


def test_plain_constructor_validates_per_kind():
    with pytest.raises(ValueError, match="original_max_positions"):
        RopeScaling("yarn", 4.0)
    for kind in ("dynamic_ntk", "llama3", "longrope"):
        with pytest.raises(ValueError, match="original_max_positions"):
            RopeScaling(kind, 4.0)
    with pytest.raises(ValueError, match="factor"):
        RopeScaling("linear", 0.5)
    with pytest.raises(ValueError, match="factor"):
        RopeScaling("ntk", 0.99)
    with pytest.raises(ValueError, match="original_max_positions"):
        RopeScaling("linear", 2.0, 4096)
    with pytest.raises(ValueError, match="beta_fast"):
        RopeScaling("llama3", 2.0, 4096, beta_fast=32.0)
    with pytest.raises(ValueError, match="low_freq_factor"):
        RopeScaling("yarn", 2.0, 4096, low_freq_factor=1.0)
    with pytest.raises(ValueError, match="short_factor"):
        RopeScaling("linear", 2.0, short_factor=[1.0])
    with pytest.raises(ValueError, match="short_factor"):
        RopeScaling("longrope", 2.0, 4096)
    with pytest.raises(ValueError, match="long_factor"):
        RopeScaling("longrope", 2.0, 4096, short_factor=[1.0])
    with pytest.raises(ValueError, match="attention_factor"):
        RopeScaling("llama3", 2.0, 4096, attention_factor=1.2)
    with pytest.raises(ValueError, match="attention_factor"):
        RopeScaling("yarn", 2.0, 4096, attention_factor=0.0)
    with pytest.raises(TypeError, match="truncate"):
        RopeScaling("yarn", 2.0, 4096, truncate=0)
    with pytest.raises(ValueError, match="kind"):
        RopeScaling("xpos", 2.0)
    with pytest.raises(TypeError, match="kind"):
        RopeScaling(3, 2.0)
    # what the plain constructor fills in equals the named constructor
    assert RopeScaling("yarn", 4.0, 4096) == RopeScaling.yarn(4.0, 4096)
    assert RopeScaling("llama3", 8, 8192) == RopeScaling.llama3(8.0, 8192, 1.0, 4.0)
    assert hash(RopeScaling.longrope([1.0, 2.0], [3.0, 4.0], 10, 2.0)) == hash(
        RopeScaling.longrope((1.0, 2.0), (3.0, 4.0), 10, 2.0)
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="factor"):
        RopeScaling.linear(0.5)
    with pytest.raises(TypeError, match="factor"):
        RopeScaling.ntk("2")
    with pytest.raises(ValueError, match="factor"):
        RopeScaling.yarn(float("nan"), 100)
    with pytest.raises(ValueError, match="original_max_positions"):
        RopeScaling.dynamic_ntk(2, 0)
    with pytest.raises(TypeError, match="original_max_positions"):
        RopeScaling.llama3(2, 81.5)
    with pytest.raises(ValueError, match="beta_fast"):
        RopeScaling.yarn(2, 100, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(ValueError, match="beta_slow"):
        RopeScaling.yarn(2, 100, beta_slow=-1.0)
    with pytest.raises(ValueError, match="high_freq_factor"):
        RopeScaling.llama3(2, 100, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="mscale_all_dim"):
        RopeScaling.yarn(2, 100, mscale=1.0)
    with pytest.raises(ValueError, match="attention_factor"):
        RopeScaling.yarn(2, 100, mscale=1.0, mscale_all_dim=1.0, attention_factor=1.1)
    with pytest.raises(ValueError, match="mscale"):
        RopeScaling.yarn(2, 100, mscale=-1.0, mscale_all_dim=1.0)
    with pytest.raises(ValueError, match="same length"):
        RopeScaling.longrope([1.0, 2.0], [1.0], 100, 2.0)
    with pytest.raises(ValueError, match=r"short_factor\[1\]"):
        RopeScaling.longrope([1.0, -2.0], [1.0, 2.0], 100, 2.0)
    with pytest.raises(TypeError, match=r"long_factor\[0\]"):
        RopeScaling.longrope([1.0], ["2"], 100, 2.0)
    with pytest.raises(TypeError, match="short_factor"):
        RopeScaling.longrope(2.0, [1.0], 100, 2.0)
    with pytest.raises(ValueError, match="short_factor"):
        RopeScaling.longrope([], [], 100, 2.0)
    with pytest.raises(ValueError, match="dim"):
        RopeScaling.longrope([1.0] * 4, [2.0] * 4, 100, 2.0).frequencies(16)
    with pytest.raises(ValueError, match="dim"):
        RopeScaling.ntk(2).frequencies(2)
    with pytest.raises(ValueError, match="dim"):
        RopeScaling.linear(2).frequencies(7)


def test_from_transformers_reads_each_type():
    read = RopeScaling.from_transformers
    assert read(None) is None
    assert read({}) is None
    assert read({"rope_type": "default", "rope_theta": 1e4}) is None
    assert read({"type": "linear", "factor": 2}) == RopeScaling.linear(2.0)
    assert read({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=2048) == (
        RopeScaling.dynamic_ntk(2.0, 2048)
    )
    # yarn without a training length falls back to max_position_embeddings, as transformers does
    assert read({"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=4096) == (
        RopeScaling.yarn(4.0, 4096)
    )
    assert read(
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 16,
            "beta_slow": 2,
            "attention_factor": 1.25,
            "truncate": False,
        }
    ) == RopeScaling.yarn(4.0, 1024, 16.0, 2.0, truncate=False, attention_factor=1.25)
    # both spellings of the type may appear if they agree
    assert read({"type": "linear", "rope_type": "linear", "factor": 3.0}) == RopeScaling.linear(3)
    # a longrope dict with its own factor uses it (not max / original)
    assert read(
        {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0], "factor": 4.0},
        max_position_embeddings=100,
        original_max_position_embeddings=50,
    ) == RopeScaling.longrope([1.0], [2.0], 50, 4.0)


def test_from_transformers_refuses_what_it_cannot_reproduce():
    read = RopeScaling.from_transformers
    with pytest.raises(TypeError, match="rope_parameters"):
        read([("rope_type", "linear")])
    # an unknown type: the message lists every known one
    with pytest.raises(
        ValueError,
        match="known types 'default', 'linear', 'dynamic', 'yarn', 'llama3', 'longrope', "
        "'proportional', 'su', got 'xpos'",
    ):
        read({"rope_type": "xpos"})
    with pytest.raises(ValueError, match="'mrope'"):
        read({"type": "mrope", "mrope_section": [16, 24, 24]})
    with pytest.raises(ValueError, match="rope_parameters\\['original_max_position_embeddings'\\]"):
        read({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match="'low_freq_factor'.*accepts"):
        read({"rope_type": "yarn", "factor": 2.0, "low_freq_factor": 1.0})
    with pytest.raises(ValueError, match="'factor'"):
        read({"rope_type": "default", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type='linear' and type='yarn'"):
        read({"rope_type": "linear", "type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="'full_attention'"):
        read({"full_attention": {"rope_type": "default"}, "sliding_attention": {}})
    with pytest.raises(ValueError, match="'factor'.*required"):
        read({"rope_type": "linear"})
    with pytest.raises(ValueError, match="'high_freq_factor'.*required"):
        read(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            }
        )
    with pytest.raises(ValueError, match="max_position_embeddings"):
        read({"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        read({"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="disagree"):
        read(
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096},
            original_max_position_embeddings=2048,
        )
    with pytest.raises(ValueError, match="factor.*max_position_embeddings"):
        read(
            {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            original_max_position_embeddings=4096,
        )
    with pytest.raises(ValueError, match="max_position_embeddings / original"):
        read(
            {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            max_position_embeddings=1024,
            original_max_position_embeddings=4096,
        )
    with pytest.raises(ValueError, match="mscale"):
        read({"rope_type": "yarn", "factor": 2.0, "mscale": 0.707}, max_position_embeddings=64)
    with pytest.raises(ValueError, match="factor"):
        read({"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match="rope_theta"):
        read({"rope_type": "linear", "factor": 2.0, "rope_theta": -1.0})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        read({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 1.5})
    with pytest.raises(TypeError, match="truncate"):
        read({"rope_type": "yarn", "factor": 2.0, "truncate": "no"}, max_position_embeddings=64)
    with pytest.raises(TypeError, match="max_position_embeddings"):
        read({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=4096.0)


def test_repr_names_the_constructor():
    assert repr(RopeScaling.linear(2)) == "RopeScaling.linear(factor=2.0)"
    assert "truncate=False" in repr(RopeScaling.yarn(2, 64, truncate=False))
    text = repr(RopeScaling.longrope([1.0] * 48, [2.0] * 48, 4096, 32.0))
    assert text.startswith("RopeScaling.longrope(short_factor=(1.0, 1.0, ..., 1.0)[48 values]")
    assert "original_max_positions=4096, factor=32.0" in text


@pytest.mark.parametrize("kind", ["dynamic_ntk", "longrope"])
def test_a_traced_length_gives_the_eager_frequencies(kind):
    """One formula per kind: a 0-d tensor length (as under torch.compile) gives the same
    float64 frequencies as the int, on both sides of the training length."""
    if kind == "dynamic_ntk":
        scaling = RopeScaling.dynamic_ntk(4.0, 1000)
    else:
        scaling = RopeScaling.longrope(
            [1.0 + i for i in range(8)], [3.0 + i for i in range(8)], 1000, 4.0
        )
    for length in (10, 1000, 1001, 6000):
        eager = scaling.frequencies(16, seq_len=length)
        traced = scaling.frequencies(16, seq_len=torch.tensor(float(length)))
        assert torch.equal(traced, eager), length


def test_every_kind_is_one_registry_entry():
    assert tuple(posenc.ROPE_SCALINGS) == (
        "linear",
        "ntk",
        "dynamic_ntk",
        "yarn",
        "llama3",
        "longrope",
        "proportional",
    )
    with pytest.raises(ValueError, match="kind must be one of 'linear', 'ntk'"):
        RopeScaling("xpos", 2.0)


# ------------------------------------------------------------------ proportional (Gemma 4)

# transformers 5.23.0, ROPE_INIT_FUNCTIONS["proportional"](Gemma4TextConfig(head_dim=16,
# global_head_dim=32, layer_types=["sliding_attention", "full_attention"], rope_parameters=
# {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.3, "factor": 2.0,
# "rope_theta": 1e6}, ...}), "cpu", layer_type="full_attention"): 0.3 * 32 // 2 = 4 rotated pairs
# (floor of 4.8), exponent over the global head dim 32.  Attention factor 1.0.
HF_GEMMA4_PROPORTIONAL = _floats(
    "0.5 0.210848257 0.0889139697 0.0374947079 0 0 0 0 0 0 0 0 0 0 0 0"
)


def test_proportional_matches_transformers_gemma4():
    scaling = RopeScaling.proportional(0.3, 2.0)
    assert scaling.attention_factor == 1.0
    got = as_list(posenc.rope_frequencies(32, base=1e6, scaling=scaling))
    assert got[4:] == [0.0] * 12  # exactly zero: those pairs never turn
    close(got[:4], HF_GEMMA4_PROPORTIONAL[:4], HF_RTOL)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.3, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("dim", [8, 32, 34])
def test_proportional_keeps_the_full_dim_ladder(fraction, dim):
    # float64 loop of the rule: pair i < floor(fraction * dim / 2) keeps base**(-2i/dim)/factor
    factor, base = 4.0, 10000.0
    rotated = math.floor(fraction * dim / 2)
    want = [base ** (-2 * i / dim) / factor if i < rotated else 0.0 for i in range(dim // 2)]
    got = as_list(
        posenc.rope_frequencies(dim, base=base, scaling=RopeScaling.proportional(fraction, factor))
    )
    assert [g == 0.0 for g in got] == [w == 0.0 for w in want]
    close([g for g in got if g], [w for w in want if w])
    # not GPT-NeoX's partial rotary, whose ladder spans only the rotated features
    if 0 < rotated < dim // 2 and rotated > 1:
        neox = as_list(posenc.rope_frequencies(2 * rotated, base=base))
        assert abs(got[1] * factor - neox[1]) > 1e-3 * neox[1]


def test_proportional_refuses_a_fraction_outside_0_1():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"rotated_fraction must be in \[0, 1\]"):
            RopeScaling.proportional(bad)
    with pytest.raises(ValueError, match="rotated_fraction applies only to kind 'proportional'"):
        RopeScaling("yarn", 2.0, 64, rotated_fraction=0.5)
