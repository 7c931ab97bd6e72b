/* Short names for the dtypes, layouts and attention types of the attention suites' case tables (one case a
 * line). */
#ifndef UATTN_TEST_CASE_NAMES_H
#define UATTN_TEST_CASE_NAMES_H

#include "uattn.h"

#define F32 UATTN_F32
#define BF16 UATTN_BF16
#define F16 UATTN_F16
#define E4M3 UATTN_FP8_E4M3
#define E5M2 UATTN_FP8_E5M2
#define NHD UATTN_LAYOUT_NHD
#define HND UATTN_LAYOUT_HND
#define TILED UATTN_LAYOUT_TILED
#define DEC UATTN_ATTENTION_DECODER
#define ENC UATTN_ATTENTION_ENCODER
#define ENC_ONLY UATTN_ATTENTION_ENCODER_ONLY
#define CROSS UATTN_ATTENTION_ENCODER_DECODER

#endif
