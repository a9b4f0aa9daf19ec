/* cublas_v2.h — the emulator's cuBLAS header (see cublas_api.h): maps the plain names to
 * the _v2 entry points, as NVIDIA's cublas_v2.h does. */
#ifndef TESSERA_EMU_CUBLAS_V2_H
#define TESSERA_EMU_CUBLAS_V2_H

#include "cublas_api.h"

#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasGetVersion cublasGetVersion_v2
#define cublasSetWorkspace cublasSetWorkspace_v2
#define cublasSetStream cublasSetStream_v2
#define cublasGetStream cublasGetStream_v2
#define cublasGetPointerMode cublasGetPointerMode_v2
#define cublasSetPointerMode cublasSetPointerMode_v2
#define cublasSgemm cublasSgemm_v2

#endif
